//! Registration with the kubelet's plugin watcher, without a node-driver-registrar sidecar.
//!
//! The kubelet watches `<kubelet dir>/plugins_registry/` for sockets (`pkg/kubelet/pluginmanager`). On one
//! it calls `GetInfo`, checks the type, name and versions, calls the driver's NodeGetInfo, installs the
//! driver in its CSINode object, and tells the plugin how it went with `NotifyRegistrationStatus`. This
//! serves that socket, `<dir>/<driver name>-reg.sock`, as the sidecar does; a refusal is logged with the
//! kubelet's reason. It works beside the sidecar as well: each serves its own socket.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use inlet_proto::pluginregistration::registration_server::{Registration, RegistrationServer};
use inlet_proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use inlet_proto::uds::{self, ServeError};
use tonic::{Request, Response, Status};

/// The plugin type of a CSI driver (`registerapi.CSIPlugin`).
pub const CSI_PLUGIN: &str = "CSIPlugin";
/// The CSI versions a kubelet may use with the driver: the kubelet wants one at 1.0.0 or above.
pub const SUPPORTED_VERSIONS: [&str; 1] = ["1.0.0"];

/// What the kubelet said of the last registration: registered, or refused with its reason.
pub type Outcome = Result<(), String>;

/// What the kubelet is told of a driver.
#[derive(Debug, Clone)]
pub struct Registrar {
    name: String,
    endpoint: PathBuf,
    outcome: Arc<tokio::sync::watch::Sender<Option<Outcome>>>,
}

impl Registrar {
    /// The driver `name`, serving CSI on `endpoint` (the path the kubelet dials).
    pub fn new(name: &str, endpoint: &Path) -> Self {
        Self {
            name: name.to_string(),
            endpoint: endpoint.to_path_buf(),
            outcome: Arc::new(tokio::sync::watch::channel(None).0),
        }
    }

    /// The kubelet's last word on the registration (None until it has spoken).
    pub fn outcome(&self) -> tokio::sync::watch::Receiver<Option<Outcome>> {
        self.outcome.subscribe()
    }

    /// Where the registration socket goes in the kubelet's `plugins_registry` dir.
    pub fn socket(&self, dir: &Path) -> PathBuf {
        dir.join(format!("{}-reg.sock", self.name))
    }

    /// Serves the registration socket in `dir` until `shutdown` resolves, then removes it (the kubelet then
    /// deregisters the driver).
    pub async fn serve(
        self,
        dir: &Path,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ServeError> {
        let socket = self.socket(dir);
        let incoming = uds::listen(&socket).await?;
        tracing::info!(socket = %socket.display(), "serving plugin registration");
        let served = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(self))
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await;
        let _ = std::fs::remove_file(&socket);
        Ok(served?)
    }
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: CSI_PLUGIN.into(),
            name: self.name.clone(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let outcome = if status.plugin_registered {
            tracing::info!(driver = %self.name, "registered with the kubelet");
            Ok(())
        } else {
            tracing::error!(driver = %self.name, reason = %status.error, "the kubelet refused the registration");
            Err(status.error)
        };
        self.outcome.send_replace(Some(outcome));
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
