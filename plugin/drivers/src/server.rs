//! Serving CSI on a unix socket: the one entry point both the `inlet-plugin` binary and tests use.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use inlet_proto::csi::v1::controller_server::{Controller, ControllerServer};
use inlet_proto::csi::v1::identity_server::{Identity, IdentityServer};
use inlet_proto::csi::v1::node_server::{Node, NodeServer};
use inlet_proto::uds;

use crate::call_log::{CallLog, LoggedNode};
use crate::metrics::{CsiMetrics, CsiMetricsLayer};

pub use uds::ServeError;

/// Serves the three CSI services on `socket` until `shutdown` resolves, then removes the socket.
///
/// A stale socket file from a crashed run is replaced; a live one is refused (see [`uds::listen`]).
/// Drivers without a controller (node-only drivers) pass `with_controller: false`, and the Controller RPCs
/// answer UNIMPLEMENTED.
pub async fn serve_csi<S>(
    socket: &Path,
    service: S,
    with_controller: bool,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError>
where
    S: Identity + Controller + Node + Clone,
{
    let incoming = uds::listen(socket).await?;
    serve_csi_on(incoming, socket, service, with_controller, None, shutdown).await
}

/// Like [`serve_csi`], on a socket the caller already bound (so it is accepting before this is spawned),
/// recording every Node call in `call_log` when there is one.
pub async fn serve_csi_on<S>(
    incoming: uds::Incoming,
    socket: &Path,
    service: S,
    with_controller: bool,
    call_log: Option<Arc<CallLog>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError>
where
    S: Identity + Controller + Node + Clone,
{
    let options = ServeOptions {
        with_controller,
        call_log,
        metrics: None,
    };
    serve_csi_with(incoming, socket, service, options, shutdown).await
}

/// What a driver is served with besides its services.
#[derive(Debug, Default)]
pub struct ServeOptions {
    /// Serve the Controller service (node-only drivers answer UNIMPLEMENTED without it).
    pub with_controller: bool,
    /// Record every Node call here.
    pub call_log: Option<Arc<CallLog>>,
    /// Time every call into `csi_operations_seconds`.
    pub metrics: Option<CsiMetrics>,
}

/// Serves on a bound socket with `options` until `shutdown` resolves, then removes the socket.
pub async fn serve_csi_with<S>(
    incoming: uds::Incoming,
    socket: &Path,
    service: S,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError>
where
    S: Identity + Controller + Node + Clone,
{
    tracing::info!(socket = %socket.display(), "serving CSI");
    let ServeOptions {
        with_controller,
        call_log,
        metrics,
    } = options;
    let router = tonic::transport::Server::builder()
        .layer(tower::util::option_layer(metrics.map(CsiMetricsLayer)))
        .add_service(IdentityServer::new(service.clone()))
        .add_optional_service(call_log.is_none().then(|| NodeServer::new(service.clone())))
        .add_optional_service(
            call_log.map(|log| NodeServer::new(LoggedNode::new(service.clone(), log))),
        )
        .add_optional_service(with_controller.then(|| ControllerServer::new(service)));
    let served = router
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    let _ = std::fs::remove_file(socket);
    tracing::info!(socket = %socket.display(), "stopped serving CSI");
    Ok(served?)
}

/// A driver method's outcome as a gRPC reply, logged by call name and code only: requests and replies are
/// never logged whole (CSI `secrets` would reach the log).
pub fn reply<T>(
    call: &'static str,
    outcome: inlet_host::Result<T>,
) -> Result<tonic::Response<T>, tonic::Status> {
    match outcome {
        Ok(reply) => {
            tracing::debug!(call, "ok");
            Ok(tonic::Response::new(reply))
        }
        Err(err) => {
            tracing::warn!(call, code = ?err.code(), error = %err, "failed");
            Err(err.into())
        }
    }
}
