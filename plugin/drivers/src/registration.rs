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
use std::time::{Duration, Instant};

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
    notices: Arc<parking_lot::Mutex<Notices>>,
}

/// Which notices are logged: a change between registered and refused always; another refusal reason, or
/// the same outcome again, at most once a second and the same one only after [`Notices::REPEAT`]; what is
/// left out is counted into the next line. A kubelet (or anything that reaches the socket) notifying in a
/// loop writes a line a second at most, and the last change of state is never left out.
#[derive(Debug, Default)]
struct Notices {
    last: Option<(Outcome, Instant)>,
    suppressed: u64,
}

impl Notices {
    const REPEAT: Duration = Duration::from_secs(60);
    const MIN_GAP: Duration = Duration::from_secs(1);

    /// Some(count of notices left out since the last line) when this one is to be logged.
    fn admit(&mut self, outcome: &Outcome, now: Instant) -> Option<u64> {
        let log = match &self.last {
            None => true,
            Some((last, at)) => {
                let since = now.saturating_duration_since(*at);
                last.is_ok() != outcome.is_ok()
                    || (since >= Self::MIN_GAP && (last != outcome || since >= Self::REPEAT))
            }
        };
        if !log {
            self.suppressed += 1;
            return None;
        }
        self.last = Some((outcome.clone(), now));
        Some(std::mem::take(&mut self.suppressed))
    }
}

impl Registrar {
    /// The driver `name`, serving CSI on `endpoint` (the path the kubelet dials).
    pub fn new(name: &str, endpoint: &Path) -> Self {
        Self {
            name: name.to_string(),
            endpoint: endpoint.to_path_buf(),
            outcome: Arc::new(tokio::sync::watch::channel(None).0),
            notices: Arc::default(),
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
        // The socket goes as soon as shutdown begins, not after the connections drain: a kubelet that keeps
        // its connection open would otherwise hold the drain past the pod's grace period, the socket would
        // outlive the driver, and the kubelet would never deregister it.
        let removed = socket.clone();
        let shutdown = async move {
            shutdown.await;
            let _ = std::fs::remove_file(&removed);
        };
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
        // The reason is the peer's text: escaped and capped before it is kept or logged.
        let outcome = match status.plugin_registered {
            true => Ok(()),
            false => Err(inlet_proto::peer_text::safe(&status.error)),
        };
        if let Some(suppressed) = self.notices.lock().admit(&outcome, Instant::now()) {
            match &outcome {
                Ok(()) => {
                    tracing::info!(driver = %self.name, suppressed, "registered with the kubelet")
                }
                Err(reason) => {
                    tracing::error!(driver = %self.name, reason = %reason, suppressed, "the kubelet refused the registration")
                }
            }
        }
        self.outcome.send_replace(Some(outcome));
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_notices_are_logged_once_a_second_at_most_and_counted() {
        let mut notices = Notices::default();
        let start = Instant::now();
        let refused: Outcome = Err("no".into());
        assert_eq!(notices.admit(&refused, start), Some(0));
        // 16,000 notices in 4 s: the same outcome again within a minute is never logged.
        for i in 0..16_000u64 {
            let at = start + Duration::from_micros(250 * i);
            assert_eq!(notices.admit(&refused, at), None);
        }
        // A change is logged (a second after the last line), with what was left out.
        let at = start + Duration::from_secs(5);
        assert_eq!(notices.admit(&Ok(()), at), Some(16_000));
        // A change of state is always logged; other reasons in a burst, one line a second.
        assert_eq!(
            notices.admit(&refused, at + Duration::from_millis(10)),
            Some(0)
        );
        let other: Outcome = Err("other".into());
        assert_eq!(notices.admit(&other, at + Duration::from_millis(20)), None);
        assert_eq!(
            notices.admit(&other, at + Duration::from_millis(1020)),
            Some(1)
        );
        // The same outcome is logged again after a minute.
        assert_eq!(notices.admit(&other, at + Duration::from_secs(62)), Some(0));
    }

    #[tokio::test]
    async fn a_refusal_reason_is_kept_escaped_and_capped() {
        let registrar = Registrar::new("local.inlet.dev", Path::new("/csi.sock"));
        let outcome = registrar.outcome();
        let reason = format!("bad\n\x1b[2J{}", "x".repeat(3 << 20));
        registrar
            .notify_registration_status(Request::new(RegistrationStatus {
                plugin_registered: false,
                error: reason,
            }))
            .await
            .unwrap();
        let kept = outcome.borrow().clone().unwrap().unwrap_err();
        assert!(kept.starts_with(r"bad\n\u{1b}[2J"), "{}", &kept[..20]);
        assert!(kept.len() < 2048, "{}", kept.len());
    }
}
