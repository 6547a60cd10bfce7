//! A CSI client for one registered driver, as the kubelet's `csi_client.go`: each call has the kubelet's
//! two-minute timeout, and every call is reported to an observer (the simulated kubelet's report) with
//! secret names but never their values, and service-account tokens redacted.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inlet_proto::csi::v1::{
    self as csi, controller_client::ControllerClient, node_client::NodeClient,
};
use inlet_proto::csi_call::{CallRequest, CsiCall};
use tonic::transport::Channel;
use tonic::{Request, Status};

/// The kubelet's timeout for one CSI call (`csiTimeout`).
pub const CSI_TIMEOUT: Duration = Duration::from_secs(120);
/// Receives every CSI call made.
pub trait CsiObserver: Send + Sync {
    /// One call, after it returned, and how long it took (from its sending to its answer).
    fn observe(&self, call: CsiCall, elapsed: Duration);
    /// A call was sent and has no answer yet: a token [`CsiObserver::finished`] gets once it has one (or
    /// is given up). A report can then show the call that hung, not only those that returned.
    fn started(&self, _call: CsiCall) -> u64 {
        0
    }
    /// The call of `token` returned or was given up.
    fn finished(&self, _token: u64) {}
}

/// A call sent: when, and, with an observer, its token, given back when dropped: before the call's record
/// is reported (so no report shows it twice), or when the task that made it is dropped.
struct InFlight {
    started: Instant,
    observer: Option<(Arc<dyn CsiObserver>, u64)>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some((observer, token)) = &self.observer {
            observer.finished(*token);
        }
    }
}

/// The client for one driver. Cheap to clone.
#[derive(Clone)]
pub struct CsiClient {
    driver: String,
    node: NodeClient<Channel>,
    controller: ControllerClient<Channel>,
    observer: Option<Arc<dyn CsiObserver>>,
    timeout: Duration,
}

impl std::fmt::Debug for CsiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsiClient")
            .field("driver", &self.driver)
            .finish()
    }
}

impl CsiClient {
    /// A client for `driver` over `channel`, reporting to `observer`.
    pub fn new(driver: &str, channel: Channel, observer: Option<Arc<dyn CsiObserver>>) -> Self {
        Self {
            driver: driver.to_string(),
            node: NodeClient::new(channel.clone()),
            controller: ControllerClient::new(channel),
            observer,
            timeout: CSI_TIMEOUT,
        }
    }

    /// The driver's name.
    pub fn driver(&self) -> &str {
        &self.driver
    }

    fn in_flight<R: CallRequest>(&self, request: &R) -> InFlight {
        let observer = self.observer.as_ref().map(|observer| {
            let token = observer.started(CsiCall::of(&self.driver, request, None));
            (Arc::clone(observer), token)
        });
        InFlight {
            started: Instant::now(),
            observer,
        }
    }

    fn report<R: CallRequest>(&self, in_flight: InFlight, request: &R, failure: Option<&Status>) {
        let elapsed = in_flight.started.elapsed();
        drop(in_flight);
        if let Some(observer) = &self.observer {
            observer.observe(CsiCall::of(&self.driver, request, failure), elapsed);
        }
    }

    fn timed<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(self.timeout);
        request
    }

    /// The same client with another deadline per call than the kubelet's [`CSI_TIMEOUT`] (conform gives a
    /// call no more than a check can wait). The channel's own timeout, which enforces it, must match.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// NodePublishVolume.
    pub async fn node_publish(&self, req: csi::NodePublishVolumeRequest) -> Result<(), Status> {
        let in_flight = self.in_flight(&req);
        let result = self
            .node
            .clone()
            .node_publish_volume(self.timed(req.clone()))
            .await;
        self.report(in_flight, &req, result.as_ref().err());
        result.map(drop)
    }

    /// NodeUnpublishVolume (no secrets, no context: the kubelet sends none).
    pub async fn node_unpublish(&self, volume_id: &str, target_path: &str) -> Result<(), Status> {
        let req = csi::NodeUnpublishVolumeRequest {
            volume_id: volume_id.into(),
            target_path: target_path.into(),
        };
        let in_flight = self.in_flight(&req);
        let result = self
            .node
            .clone()
            .node_unpublish_volume(self.timed(req.clone()))
            .await;
        self.report(in_flight, &req, result.as_ref().err());
        result.map(drop)
    }

    /// NodeStageVolume.
    pub async fn node_stage(&self, req: csi::NodeStageVolumeRequest) -> Result<(), Status> {
        let in_flight = self.in_flight(&req);
        let result = self
            .node
            .clone()
            .node_stage_volume(self.timed(req.clone()))
            .await;
        self.report(in_flight, &req, result.as_ref().err());
        result.map(drop)
    }

    /// NodeUnstageVolume.
    pub async fn node_unstage(&self, volume_id: &str, staging_path: &str) -> Result<(), Status> {
        let req = csi::NodeUnstageVolumeRequest {
            volume_id: volume_id.into(),
            staging_target_path: staging_path.into(),
        };
        let in_flight = self.in_flight(&req);
        let result = self
            .node
            .clone()
            .node_unstage_volume(self.timed(req.clone()))
            .await;
        self.report(in_flight, &req, result.as_ref().err());
        result.map(drop)
    }

    /// NodeGetCapabilities, as the RPC types the driver advertises.
    pub async fn node_capabilities(
        &self,
    ) -> Result<Vec<csi::node_service_capability::rpc::Type>, Status> {
        let req = csi::NodeGetCapabilitiesRequest {};
        let in_flight = self.in_flight(&req);
        let result = self
            .node
            .clone()
            .node_get_capabilities(self.timed(req))
            .await;
        self.report(in_flight, &req, result.as_ref().err());
        Ok(result?
            .into_inner()
            .capabilities
            .into_iter()
            .filter_map(|c| match c.r#type {
                Some(csi::node_service_capability::Type::Rpc(rpc)) => {
                    csi::node_service_capability::rpc::Type::try_from(rpc.r#type).ok()
                }
                _ => None,
            })
            .collect())
    }

    /// NodeGetVolumeStats of the volume published at `volume_path` (no staging path, as the kubelet's
    /// `csi_client.go` sends none).
    pub async fn node_volume_stats(
        &self,
        volume_id: &str,
        volume_path: &str,
    ) -> Result<csi::NodeGetVolumeStatsResponse, Status> {
        let req = csi::NodeGetVolumeStatsRequest {
            volume_id: volume_id.into(),
            volume_path: volume_path.into(),
            staging_target_path: String::new(),
        };
        let in_flight = self.in_flight(&req);
        let result = self
            .node
            .clone()
            .node_get_volume_stats(self.timed(req.clone()))
            .await;
        self.report(in_flight, &req, result.as_ref().err());
        Ok(result?.into_inner())
    }

    /// CreateVolume (what the external-provisioner asks for a claim).
    pub async fn create_volume(
        &self,
        req: csi::CreateVolumeRequest,
    ) -> Result<csi::Volume, Status> {
        let in_flight = self.in_flight(&req);
        let result = self
            .controller
            .clone()
            .create_volume(self.timed(req.clone()))
            .await;
        self.report(in_flight, &req, result.as_ref().err());
        result?
            .into_inner()
            .volume
            .ok_or_else(|| Status::internal("CreateVolume answered no volume"))
    }

    /// ControllerExpandVolume (what the external-resizer asks): the new capacity, and whether the node
    /// must expand the volume too.
    pub async fn controller_expand(
        &self,
        req: csi::ControllerExpandVolumeRequest,
    ) -> Result<csi::ControllerExpandVolumeResponse, Status> {
        let in_flight = self.in_flight(&req);
        let result = self
            .controller
            .clone()
            .controller_expand_volume(self.timed(req.clone()))
            .await;
        self.report(in_flight, &req, result.as_ref().err());
        Ok(result?.into_inner())
    }

    /// NodeExpandVolume.
    pub async fn node_expand(&self, req: csi::NodeExpandVolumeRequest) -> Result<(), Status> {
        let in_flight = self.in_flight(&req);
        let result = self
            .node
            .clone()
            .node_expand_volume(self.timed(req.clone()))
            .await;
        self.report(in_flight, &req, result.as_ref().err());
        result.map(drop)
    }

    /// DeleteVolume.
    pub async fn delete_volume(&self, volume_id: &str) -> Result<(), Status> {
        let req = csi::DeleteVolumeRequest {
            volume_id: volume_id.into(),
            secrets: Default::default(),
        };
        let in_flight = self.in_flight(&req);
        let result = self
            .controller
            .clone()
            .delete_volume(self.timed(req.clone()))
            .await;
        self.report(in_flight, &req, result.as_ref().err());
        result.map(drop)
    }

    /// NodeGetInfo.
    pub async fn node_info(&self) -> Result<csi::NodeGetInfoResponse, Status> {
        let req = csi::NodeGetInfoRequest {};
        let in_flight = self.in_flight(&req);
        let result = self.node.clone().node_get_info(self.timed(req)).await;
        self.report(in_flight, &req, result.as_ref().err());
        Ok(result?.into_inner())
    }

    /// ControllerGetCapabilities, as the RPC types the driver advertises.
    pub async fn controller_capabilities(
        &self,
    ) -> Result<Vec<csi::controller_service_capability::rpc::Type>, Status> {
        let req = csi::ControllerGetCapabilitiesRequest {};
        let in_flight = self.in_flight(&req);
        let result = self
            .controller
            .clone()
            .controller_get_capabilities(self.timed(req))
            .await;
        self.report(in_flight, &req, result.as_ref().err());
        Ok(result?
            .into_inner()
            .capabilities
            .into_iter()
            .filter_map(|c| match c.r#type {
                Some(csi::controller_service_capability::Type::Rpc(rpc)) => {
                    csi::controller_service_capability::rpc::Type::try_from(rpc.r#type).ok()
                }
                _ => None,
            })
            .collect())
    }

    /// ControllerPublishVolume; returns the publish context (which the record shows too).
    pub async fn controller_publish(
        &self,
        req: csi::ControllerPublishVolumeRequest,
    ) -> Result<HashMap<String, String>, Status> {
        let in_flight = self.in_flight(&req);
        let result = self
            .controller
            .clone()
            .controller_publish_volume(self.timed(req.clone()))
            .await
            .map(|r| r.into_inner().publish_context);
        let elapsed = in_flight.started.elapsed();
        drop(in_flight);
        if let Some(observer) = &self.observer {
            let mut call = CsiCall::of(&self.driver, &req, result.as_ref().err());
            if let Ok(context) = &result {
                call.publish_context = context
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
            }
            observer.observe(call, elapsed);
        }
        result
    }

    /// ControllerUnpublishVolume.
    pub async fn controller_unpublish(
        &self,
        req: csi::ControllerUnpublishVolumeRequest,
    ) -> Result<(), Status> {
        let in_flight = self.in_flight(&req);
        let result = self
            .controller
            .clone()
            .controller_unpublish_volume(self.timed(req.clone()))
            .await;
        self.report(in_flight, &req, result.as_ref().err());
        result.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inlet_proto::csi::v1::node_server::{Node, NodeServer};

    /// A driver whose NodePublishVolume never answers (a mount hung on a dead server).
    struct Hung;

    #[tonic::async_trait]
    impl Node for Hung {
        async fn node_publish_volume(
            &self,
            _: Request<csi::NodePublishVolumeRequest>,
        ) -> Result<tonic::Response<csi::NodePublishVolumeResponse>, Status> {
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn a_call_the_driver_never_answers_fails_at_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("csi.sock");
        let incoming = inlet_proto::uds::listen(&socket).await.unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(NodeServer::new(Hung))
                .serve_with_incoming(incoming),
        );
        let timeout = Duration::from_millis(200);
        let channel = inlet_proto::uds::connect_with_timeout(&socket, Some(timeout))
            .await
            .unwrap();
        let client = CsiClient::new("hung.example.com", channel, None);
        let started = std::time::Instant::now();
        let status = client
            .node_publish(csi::NodePublishVolumeRequest::default())
            .await
            .unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(
            inlet_proto::csi_call::rpc_error(&status),
            "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
        );
    }
}
