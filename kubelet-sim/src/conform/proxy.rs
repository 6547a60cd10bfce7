//! A CSI proxy between the simulated kubelet and the driver under test, so a check can make the kubelet
//! see what it sees on a busy node: a call whose deadline passed after the driver had done its work. The
//! kubelet then retries (`operation_generator.go` marks the mount uncertain on a timeout), and the driver
//! must answer the repeat as the CSI spec's idempotency section asks: OK, with nothing done twice. It can
//! also turn an OK into a final error (INTERNAL), as a driver whose republish fails would answer.
//!
//! Every other call passes through unchanged, and each is recorded as it returns (a [`CsiCall`]: secrets
//! by key only): against a real kubelet (`conform --kubeconfig`) the proxy is the only place that sees
//! them. Like the kubelet's `csi_client.go`, the proxy dials the
//! driver's socket for each call, so a restarted driver is reached again with no reconnect logic.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use inlet_proto::csi::v1::{
    self as csi, controller_client::ControllerClient, controller_server::Controller,
    identity_client::IdentityClient, identity_server::Identity, node_client::NodeClient,
    node_server::Node,
};
use inlet_proto::csi_call::{CallRequest, CsiCall};
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
    /// The driver's name, which each recorded call carries.
    driver: String,
    calls: Arc<Mutex<Vec<CsiCall>>>,
    /// Each forwarded call's deadline: the kubelet's, so the proxy never holds a call the kubelet gave up.
    timeout: Duration,
}

impl FaultProxy {
    /// A proxy to driver `driver` serving on `upstream`, each call forwarded with `timeout`.
    pub fn new(driver: &str, upstream: &Path, timeout: Duration) -> Self {
        Self {
            upstream: upstream.to_path_buf(),
            faults: Arc::default(),
            injected: Arc::default(),
            driver: driver.to_string(),
            calls: Arc::default(),
            timeout,
        }
    }

    /// Every call that passed through, in the order they returned, with the answer the caller got.
    pub fn calls(&self) -> Vec<CsiCall> {
        self.calls.lock().clone()
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

    /// The driver's answer, or the fault's error in its place when one asks for it; recorded.
    fn answer<R: CallRequest, T>(
        &self,
        request: &R,
        reply: Result<Response<T>, Status>,
    ) -> Result<Response<T>, Status> {
        let reply = self.faulted(R::METHOD, reply);
        let call = CsiCall::of(&self.driver, request, reply.as_ref().err());
        self.calls.lock().push(call);
        reply
    }

    fn faulted<T>(
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
    ($service:ident, $client:ident, { $($rpc:ident($request:ty) -> $response:ty;)* }) => {
        #[tonic::async_trait]
        impl $service for FaultProxy {
            $(
                async fn $rpc(&self, request: Request<$request>) -> Result<Response<$response>, Status> {
                    let request = request.into_inner();
                    let reply = match self.dial().await {
                        Ok(channel) => $client::new(channel).$rpc(self.timed(request.clone())).await,
                        Err(status) => Err(status),
                    };
                    self.answer(&request, reply)
                }
            )*
        }
    };
}

forward!(Identity, IdentityClient, {
    get_plugin_info(csi::GetPluginInfoRequest) -> csi::GetPluginInfoResponse;
    get_plugin_capabilities(csi::GetPluginCapabilitiesRequest) -> csi::GetPluginCapabilitiesResponse;
    probe(csi::ProbeRequest) -> csi::ProbeResponse;
});

forward!(Node, NodeClient, {
    node_stage_volume(csi::NodeStageVolumeRequest) -> csi::NodeStageVolumeResponse;
    node_unstage_volume(csi::NodeUnstageVolumeRequest) -> csi::NodeUnstageVolumeResponse;
    node_publish_volume(csi::NodePublishVolumeRequest) -> csi::NodePublishVolumeResponse;
    node_unpublish_volume(csi::NodeUnpublishVolumeRequest) -> csi::NodeUnpublishVolumeResponse;
    node_get_volume_stats(csi::NodeGetVolumeStatsRequest) -> csi::NodeGetVolumeStatsResponse;
    node_expand_volume(csi::NodeExpandVolumeRequest) -> csi::NodeExpandVolumeResponse;
    node_get_capabilities(csi::NodeGetCapabilitiesRequest) -> csi::NodeGetCapabilitiesResponse;
    node_get_info(csi::NodeGetInfoRequest) -> csi::NodeGetInfoResponse;
});

forward!(Controller, ControllerClient, {
    create_volume(csi::CreateVolumeRequest) -> csi::CreateVolumeResponse;
    delete_volume(csi::DeleteVolumeRequest) -> csi::DeleteVolumeResponse;
    controller_publish_volume(csi::ControllerPublishVolumeRequest) -> csi::ControllerPublishVolumeResponse;
    controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest) -> csi::ControllerUnpublishVolumeResponse;
    validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest) -> csi::ValidateVolumeCapabilitiesResponse;
    list_volumes(csi::ListVolumesRequest) -> csi::ListVolumesResponse;
    get_capacity(csi::GetCapacityRequest) -> csi::GetCapacityResponse;
    controller_get_capabilities(csi::ControllerGetCapabilitiesRequest) -> csi::ControllerGetCapabilitiesResponse;
    controller_expand_volume(csi::ControllerExpandVolumeRequest) -> csi::ControllerExpandVolumeResponse;
    controller_get_volume(csi::ControllerGetVolumeRequest) -> csi::ControllerGetVolumeResponse;
});
