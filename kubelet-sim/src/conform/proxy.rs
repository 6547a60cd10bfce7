//! A CSI proxy between the simulated kubelet and the driver under test, so a check can make the kubelet
//! see what it sees on a busy node: a call whose deadline passed after the driver had done its work. The
//! kubelet then retries (`operation_generator.go` marks the mount uncertain on a timeout), and the driver
//! must answer the repeat as the CSI spec's idempotency section asks: OK, with nothing done twice. It can
//! also turn an OK into a final error (INTERNAL), as a driver whose republish fails would answer.
//!
//! Every other call passes through unchanged. Like the kubelet's `csi_client.go`, the proxy dials the
//! driver's socket for each call, so a restarted driver is reached again with no reconnect logic.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use inlet_proto::csi::v1::{
    self as csi, controller_client::ControllerClient, controller_server::Controller,
    identity_client::IdentityClient, identity_server::Identity, node_client::NodeClient,
    node_server::Node,
};
use parking_lot::Mutex;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// What a check asks the proxy to do to the next successful answers of one RPC.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fault {
    /// The RPC (`NodePublishVolume`).
    method: &'static str,
    /// How many more successful answers are replaced.
    times: usize,
    /// What replaces them: DEADLINE_EXCEEDED or INTERNAL.
    code: tonic::Code,
}

/// The message the kubelet sees in place of the driver's OK, as DEADLINE_EXCEEDED.
pub const INJECTED_DEADLINE: &str =
    "context deadline exceeded (injected by kubelet-sim conform after the driver answered OK)";

/// The message the kubelet sees in place of the driver's OK, as INTERNAL.
pub const INJECTED_FAILURE: &str =
    "failure injected by kubelet-sim conform after the driver answered OK";

/// The proxy's state, shared by its server and the check that drives it.
#[derive(Clone)]
pub struct FaultProxy {
    upstream: PathBuf,
    faults: Arc<Mutex<Vec<Fault>>>,
    injected: Arc<Mutex<Vec<&'static str>>>,
    /// Each forwarded call's deadline: the kubelet's, so the proxy never holds a call the kubelet gave up.
    timeout: Duration,
}

impl FaultProxy {
    /// A proxy to the driver serving on `upstream`, each call forwarded with `timeout`.
    pub fn new(upstream: &Path, timeout: Duration) -> Self {
        Self {
            upstream: upstream.to_path_buf(),
            faults: Arc::default(),
            injected: Arc::default(),
            timeout,
        }
    }

    /// The next `times` successful answers to `method` reach the kubelet as DEADLINE_EXCEEDED.
    pub fn deadline_after_success(&self, method: &'static str, times: usize) {
        let code = tonic::Code::DeadlineExceeded;
        self.faults.lock().push(Fault {
            method,
            times,
            code,
        });
    }

    /// The next `times` successful answers to `method` reach the kubelet as INTERNAL, a final error.
    pub fn fail_after_success(&self, method: &'static str, times: usize) {
        let code = tonic::Code::Internal;
        self.faults.lock().push(Fault {
            method,
            times,
            code,
        });
    }

    /// The RPCs whose answers were replaced so far, in order.
    pub fn injected(&self) -> Vec<&'static str> {
        self.injected.lock().clone()
    }

    async fn dial(&self) -> Result<Channel, Status> {
        inlet_proto::uds::connect_with_timeout(&self.upstream, Some(self.timeout))
            .await
            .map_err(|e| Status::unavailable(format!("the driver is not reachable: {e}")))
    }

    fn timed<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(self.timeout);
        request
    }

    /// The driver's answer, or the fault's error in its place when one asks for it.
    fn answer<T>(
        &self,
        method: &'static str,
        reply: Result<Response<T>, Status>,
    ) -> Result<Response<T>, Status> {
        if reply.is_ok() {
            let mut faults = self.faults.lock();
            if let Some(fault) = faults
                .iter_mut()
                .find(|f| f.method == method && f.times > 0)
            {
                fault.times -= 1;
                self.injected.lock().push(method);
                return Err(match fault.code {
                    tonic::Code::DeadlineExceeded => Status::deadline_exceeded(INJECTED_DEADLINE),
                    code => Status::new(code, INJECTED_FAILURE),
                });
            }
        }
        reply
    }
}

/// Implements a CSI service on [`FaultProxy`] by forwarding each listed RPC to the driver; the RPCs not
/// listed (snapshots, group controller) answer UNIMPLEMENTED, which no kubelet calls.
macro_rules! forward {
    ($service:ident, $client:ident, { $($rpc:ident($request:ty) -> $response:ty = $name:literal;)* }) => {
        #[tonic::async_trait]
        impl $service for FaultProxy {
            $(
                async fn $rpc(&self, request: Request<$request>) -> Result<Response<$response>, Status> {
                    let channel = self.dial().await?;
                    let reply = $client::new(channel).$rpc(self.timed(request.into_inner())).await;
                    self.answer($name, reply)
                }
            )*
        }
    };
}

forward!(Identity, IdentityClient, {
    get_plugin_info(csi::GetPluginInfoRequest) -> csi::GetPluginInfoResponse = "GetPluginInfo";
    get_plugin_capabilities(csi::GetPluginCapabilitiesRequest) -> csi::GetPluginCapabilitiesResponse = "GetPluginCapabilities";
    probe(csi::ProbeRequest) -> csi::ProbeResponse = "Probe";
});

forward!(Node, NodeClient, {
    node_stage_volume(csi::NodeStageVolumeRequest) -> csi::NodeStageVolumeResponse = "NodeStageVolume";
    node_unstage_volume(csi::NodeUnstageVolumeRequest) -> csi::NodeUnstageVolumeResponse = "NodeUnstageVolume";
    node_publish_volume(csi::NodePublishVolumeRequest) -> csi::NodePublishVolumeResponse = "NodePublishVolume";
    node_unpublish_volume(csi::NodeUnpublishVolumeRequest) -> csi::NodeUnpublishVolumeResponse = "NodeUnpublishVolume";
    node_get_volume_stats(csi::NodeGetVolumeStatsRequest) -> csi::NodeGetVolumeStatsResponse = "NodeGetVolumeStats";
    node_expand_volume(csi::NodeExpandVolumeRequest) -> csi::NodeExpandVolumeResponse = "NodeExpandVolume";
    node_get_capabilities(csi::NodeGetCapabilitiesRequest) -> csi::NodeGetCapabilitiesResponse = "NodeGetCapabilities";
    node_get_info(csi::NodeGetInfoRequest) -> csi::NodeGetInfoResponse = "NodeGetInfo";
});

forward!(Controller, ControllerClient, {
    create_volume(csi::CreateVolumeRequest) -> csi::CreateVolumeResponse = "CreateVolume";
    delete_volume(csi::DeleteVolumeRequest) -> csi::DeleteVolumeResponse = "DeleteVolume";
    controller_publish_volume(csi::ControllerPublishVolumeRequest) -> csi::ControllerPublishVolumeResponse = "ControllerPublishVolume";
    controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest) -> csi::ControllerUnpublishVolumeResponse = "ControllerUnpublishVolume";
    validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest) -> csi::ValidateVolumeCapabilitiesResponse = "ValidateVolumeCapabilities";
    list_volumes(csi::ListVolumesRequest) -> csi::ListVolumesResponse = "ListVolumes";
    get_capacity(csi::GetCapacityRequest) -> csi::GetCapacityResponse = "GetCapacity";
    controller_get_capabilities(csi::ControllerGetCapabilitiesRequest) -> csi::ControllerGetCapabilitiesResponse = "ControllerGetCapabilities";
    controller_expand_volume(csi::ControllerExpandVolumeRequest) -> csi::ControllerExpandVolumeResponse = "ControllerExpandVolume";
    controller_get_volume(csi::ControllerGetVolumeRequest) -> csi::ControllerGetVolumeResponse = "ControllerGetVolume";
});
