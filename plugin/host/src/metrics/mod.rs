//! Prometheus metrics: what the drivers and kubelet-sim share to expose theirs.
//!
//! Each program keeps one [`prometheus_client::registry::Registry`], registers its families in it, and
//! serves it with [`serve`] on `--metrics-address` (`GET /metrics`, OpenMetrics text). Families are
//! plain values: code records into them whether or not they are registered anywhere, so a library (the
//! image engine, a driver served in-process by kubelet-sim) holds its families unconditionally and the
//! binary decides whether they are exposed.
//!
//! - [`server`]: the HTTP endpoint (and a program's `/healthz`), bound before the program reports itself started, so a port in use is
//!   a start-up error.
//! - [`process`]: `process_*`, the figures every Go component (the kubelet, the CSI sidecars) exposes
//!   through client_golang's process collector, read from `/proc/self`.
//! - [`OPERATION_BUCKETS`]: the buckets upstream's storage and CSI operation histograms use.

pub mod process;
pub mod server;

pub use server::{HealthCheck, MetricsEndpoint, MetricsError, MetricsListener, bind, serve};

/// The buckets of the kubelet's `storage_operation_duration_seconds` and `csi_operations_seconds`, and of
/// the CSI sidecars' operation histograms (`pkg/volume/util/metrics.go`, csi-lib-utils
/// `metrics/metrics.go`), in seconds.
pub const OPERATION_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

/// A histogram with [`OPERATION_BUCKETS`], the constructor a `Family` of them takes.
pub fn operation_histogram() -> prometheus_client::metrics::histogram::Histogram {
    prometheus_client::metrics::histogram::Histogram::new(OPERATION_BUCKETS)
}

/// Writes one gauge family a collector computes at a scrape: each row's labels and value.
pub fn encode_gauges<L: prometheus_client::encoding::EncodeLabelSet>(
    encoder: &mut prometheus_client::encoding::DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, i64)>,
) -> Result<(), std::fmt::Error> {
    use prometheus_client::encoding::EncodeMetric;
    use prometheus_client::metrics::{MetricType, gauge::ConstGauge};
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in rows {
        ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A gRPC code as upstream's metrics spell it: grpc-go's `codes.Code.String()` (`OK`, `Canceled`,
/// `DeadlineExceeded`), which differs from tonic's `Debug` in two names.
pub fn grpc_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}
