//! cri-fake: a fake CRI runtime that real CRI clients accept, for scenarios without a container runtime.
//!
//! It serves `runtime.v1` RuntimeService (sandboxes and containers) and ImageService on a unix socket, keeps
//! the CRI's idempotency rules (stop and remove of something missing succeed), makes the checks a real runtime
//! makes (a mount's host path must exist, names are reserved, a container needs a ready sandbox and a pulled
//! image), logs every call for tests, and injects faults (an error or a delay per method).
//! Containers are records, not processes: a started container is Running until stopped, unless its
//! command is a small program cri-fake understands ([`program`]: `true`, `sh -c 'exit 3'`, ...), which
//! then exits as it would, writing its output to the container's CRI log.
//!
//! # Layout
//! - [`state`]: [`FakeRuntime`], the runtime's state and rules, the call log and fault application.
//! - [`service`]: the tonic services over it.
//! - [`images`]: the images CRI reports, kept in containers/storage's layout ([`storage`]); real content
//!   pulled from configured registries or imported from OCI layouts ([`pull`]).
//! - [`layout`]: building small images (OCI layouts) and pushing them to a registry, for tests and demos.
//! - [`registry`]: a private `docker-registry` on a local port, optionally with basic auth.
//! - [`containerd`]: a private `containerd` in a directory of its own.
//! - [`program`]: how a container's command ends.
//! - [`faults`]: fault configuration from a file, flags or tests.
//! - [`serve`]: serving both services on a socket until shutdown; the `cri-fake` binary wraps it.

pub mod containerd;
pub mod faults;
pub mod images;
pub mod layout;
pub mod program;
pub mod pull;
pub mod registry;
pub mod service;
pub mod state;
pub mod storage;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use inlet_proto::runtime::v1::image_service_server::ImageServiceServer;
use inlet_proto::runtime::v1::runtime_service_server::RuntimeServiceServer;
use inlet_proto::uds;

pub use state::FakeRuntime;

pub use uds::ServeError;

/// Serves RuntimeService and ImageService for `runtime` on `socket` until `shutdown`, then removes the socket.
pub async fn serve(
    socket: &Path,
    runtime: Arc<FakeRuntime>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let incoming = uds::listen(socket).await?;
    let service = service::CriService::new(runtime);
    tracing::info!(socket = %socket.display(), "serving CRI");
    let served = tonic::transport::Server::builder()
        .add_service(RuntimeServiceServer::new(service.clone()))
        .add_service(ImageServiceServer::new(service))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    let _ = std::fs::remove_file(socket);
    Ok(served?)
}
