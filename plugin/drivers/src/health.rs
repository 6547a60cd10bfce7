//! The driver's liveness check: a connection to its own CSI socket and an `Identity.Probe`, as the
//! livenessprobe sidecar's `checkProbe` makes it (kubernetes-csi/livenessprobe `cmd/livenessprobe/main.go`).
//!
//! Two ways in, one check:
//! - `GET /healthz` beside `/metrics` (`serve --metrics-address`), which the DaemonSets' `httpGet` liveness
//!   probe asks. The kubelet probes over HTTP, so nothing is exec'd in the driver's container: on a node
//!   where an exec into a privileged container fails (CRI-O here: "unable to apply caps"), an exec probe
//!   would fail every time and the kubelet would restart a healthy driver every 30 s.
//! - `inlet-plugin probe`, for a shell or an exec probe.
//!
//! The check goes through the socket, so a driver that stopped answering the kubelet fails it, and a hung
//! process fails it by its deadline.

use std::path::{Path, PathBuf};
use std::time::Duration;

use inlet_proto::csi::v1::{ProbeRequest, identity_client::IdentityClient};
use tokio::time::Instant;

/// The sidecar's text when the driver answers Probe with `ready: false`.
pub const NOT_READY: &str = "driver responded but is not ready";

/// Checks the driver at `socket`: connects and calls Probe, both within `timeout` (one deadline for the
/// whole check, as the sidecar's `--probe-timeout`). The error says what failed, in the sidecar's words
/// where it has them.
pub async fn check(socket: &Path, timeout: Duration) -> Result<(), String> {
    // A timeout past what the clock can add is no deadline at all, not a panic.
    let deadline = Instant::now()
        .checked_add(timeout)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400 * 365));
    let channel = tokio::time::timeout_at(deadline, inlet_proto::uds::connect(socket))
        .await
        .map_err(|_| format!("{}: no connection within {timeout:?}", socket.display()))?
        .map_err(|e| format!("{}: {e}", socket.display()))?;
    let mut request = tonic::Request::new(ProbeRequest {});
    // The driver is told what is left of the deadline (grpc-timeout), and the call stops there.
    request.set_timeout(deadline.saturating_duration_since(Instant::now()));
    let response = tokio::time::timeout_at(deadline, IdentityClient::new(channel).probe(request))
        .await
        .map_err(|_| "Probe: rpc error: code = DeadlineExceeded desc = context deadline exceeded")?
        .map_err(|e| format!("Probe: {}", inlet_proto::csi_call::rpc_error(&e)))?;
    // An unset `ready` means ready (CSI spec, Probe).
    match response.into_inner().ready {
        Some(false) => Err(NOT_READY.into()),
        _ => Ok(()),
    }
}

/// `/healthz` for the metrics endpoint: [`check`] of `socket` within `timeout`, logged when it fails.
pub fn health_check(socket: PathBuf, timeout: Duration) -> inlet_host::metrics::HealthCheck {
    std::sync::Arc::new(move || {
        let socket = socket.clone();
        Box::pin(async move {
            let checked = check(&socket, timeout).await;
            if let Err(error) = &checked {
                tracing::error!(%error, "health check failed");
            }
            checked
        })
    })
}
