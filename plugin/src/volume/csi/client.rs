//! A CSI client for one registered driver, as the kubelet's `csi_client.go`: each call has the kubelet's
//! two-minute timeout, and every call is reported to an observer (the simulated kubelet's report) with
//! secret names but never their values, and service-account tokens redacted.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use inlet_proto::csi::v1::{
    self as csi, controller_client::ControllerClient, node_client::NodeClient,
};
use tonic::transport::Channel;
use tonic::{Request, Status};

/// The kubelet's timeout for one CSI call (`csiTimeout`).
pub const CSI_TIMEOUT: Duration = Duration::from_secs(120);
/// The volume-context key whose value carries service-account tokens: never reported.
pub const TOKENS_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";

/// One CSI call as the report shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CsiCall {
    /// The driver's name.
    pub driver: String,
    /// The RPC (`NodePublishVolume`).
    pub method: String,
    /// The volume handle.
    pub volume_id: String,
    /// `target_path`, when the call has one.
    pub target_path: String,
    /// `staging_target_path`, when the call has one.
    pub staging_path: String,
    /// The `readonly` flag.
    pub readonly: bool,
    /// The volume context (tokens redacted).
    pub volume_context: BTreeMap<String, String>,
    /// The names of the secrets' keys, never their values.
    pub secret_keys: Vec<String>,
    /// The publish context.
    pub publish_context: BTreeMap<String, String>,
    /// `OK` or the gRPC code's name.
    pub code: String,
    /// The driver's error message (empty when OK): the evidence a failed call leaves.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The capability's access mode (`SINGLE_NODE_WRITER`), when the call has a capability.
    pub access_mode: String,
    /// The capability's `volume_mount_group` (the fsGroup a VOLUME_MOUNT_GROUP driver applies).
    pub volume_mount_group: String,
}

/// Receives every CSI call made.
pub trait CsiObserver: Send + Sync {
    /// One call, after it returned.
    fn observe(&self, call: CsiCall);
}

/// The client for one driver. Cheap to clone.
#[derive(Clone)]
pub struct CsiClient {
    driver: String,
    node: NodeClient<Channel>,
    controller: ControllerClient<Channel>,
    observer: Option<Arc<dyn CsiObserver>>,
}

impl std::fmt::Debug for CsiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsiClient")
            .field("driver", &self.driver)
            .finish()
    }
}

/// What a call's report needs from its request.
#[derive(Default)]
pub struct CallInfo<'a> {
    volume_id: &'a str,
    target_path: &'a str,
    staging_path: &'a str,
    readonly: bool,
    volume_context: Option<&'a HashMap<String, String>>,
    secrets: Option<&'a HashMap<String, String>>,
    publish_context: Option<&'a HashMap<String, String>>,
    capability: Option<&'a csi::VolumeCapability>,
}

/// A CSI request a [`CsiCall`] can be made of: its method's name and the fields the record keeps.
pub trait CallRequest {
    /// The RPC's name (`NodePublishVolume`).
    const METHOD: &'static str;
    /// The fields a record keeps.
    fn info(&self) -> CallInfo<'_>;
}

macro_rules! call_request {
    ($request:ty, $method:literal) => {
        call_request!($request, $method, |_r| CallInfo::default());
    };
    ($request:ty, $method:literal, |$r:ident| $info:expr) => {
        impl CallRequest for $request {
            const METHOD: &'static str = $method;
            fn info(&self) -> CallInfo<'_> {
                let $r = self;
                $info
            }
        }
    };
}

call_request!(csi::NodePublishVolumeRequest, "NodePublishVolume", |r| {
    CallInfo {
        volume_id: &r.volume_id,
        target_path: &r.target_path,
        staging_path: &r.staging_target_path,
        readonly: r.readonly,
        volume_context: Some(&r.volume_context),
        secrets: Some(&r.secrets),
        publish_context: Some(&r.publish_context),
        capability: r.volume_capability.as_ref(),
    }
});
call_request!(
    csi::NodeUnpublishVolumeRequest,
    "NodeUnpublishVolume",
    |r| CallInfo {
        volume_id: &r.volume_id,
        target_path: &r.target_path,
        ..Default::default()
    }
);
call_request!(csi::NodeStageVolumeRequest, "NodeStageVolume", |r| {
    CallInfo {
        volume_id: &r.volume_id,
        staging_path: &r.staging_target_path,
        volume_context: Some(&r.volume_context),
        secrets: Some(&r.secrets),
        publish_context: Some(&r.publish_context),
        capability: r.volume_capability.as_ref(),
        ..Default::default()
    }
});
call_request!(csi::NodeUnstageVolumeRequest, "NodeUnstageVolume", |r| {
    CallInfo {
        volume_id: &r.volume_id,
        staging_path: &r.staging_target_path,
        ..Default::default()
    }
});
call_request!(csi::NodeGetVolumeStatsRequest, "NodeGetVolumeStats", |r| {
    CallInfo {
        volume_id: &r.volume_id,
        target_path: &r.volume_path,
        staging_path: &r.staging_target_path,
        ..Default::default()
    }
});
call_request!(csi::NodeExpandVolumeRequest, "NodeExpandVolume", |r| {
    CallInfo {
        volume_id: &r.volume_id,
        target_path: &r.volume_path,
        staging_path: &r.staging_target_path,
        secrets: Some(&r.secrets),
        capability: r.volume_capability.as_ref(),
        ..Default::default()
    }
});
call_request!(csi::NodeGetCapabilitiesRequest, "NodeGetCapabilities");
call_request!(csi::NodeGetInfoRequest, "NodeGetInfo");
call_request!(
    csi::ControllerGetCapabilitiesRequest,
    "ControllerGetCapabilities"
);
call_request!(
    csi::ControllerPublishVolumeRequest,
    "ControllerPublishVolume",
    |r| CallInfo {
        volume_id: &r.volume_id,
        readonly: r.readonly,
        volume_context: Some(&r.volume_context),
        secrets: Some(&r.secrets),
        capability: r.volume_capability.as_ref(),
        ..Default::default()
    }
);
call_request!(
    csi::ControllerUnpublishVolumeRequest,
    "ControllerUnpublishVolume",
    |r| CallInfo {
        volume_id: &r.volume_id,
        secrets: Some(&r.secrets),
        ..Default::default()
    }
);

impl CsiCall {
    /// The record of `request` sent to `driver`, answered with `failure` (None: OK). Secrets keep only
    /// their key names; service-account tokens are redacted.
    pub fn of<R: CallRequest>(driver: &str, request: &R, failure: Option<&Status>) -> Self {
        let info = request.info();
        let map = |m: Option<&HashMap<String, String>>| -> BTreeMap<String, String> {
            m.into_iter()
                .flatten()
                .map(|(k, v)| {
                    let value = if k == TOKENS_KEY {
                        redact_tokens(v)
                    } else {
                        v.clone()
                    };
                    (k.clone(), value)
                })
                .collect()
        };
        let mut secret_keys: Vec<String> = info
            .secrets
            .into_iter()
            .flatten()
            .map(|(k, _)| k.clone())
            .collect();
        secret_keys.sort();
        CsiCall {
            driver: driver.to_string(),
            method: R::METHOD.to_string(),
            volume_id: info.volume_id.to_string(),
            target_path: info.target_path.to_string(),
            staging_path: info.staging_path.to_string(),
            readonly: info.readonly,
            volume_context: map(info.volume_context),
            secret_keys,
            publish_context: map(info.publish_context),
            code: match failure {
                None => "OK".into(),
                Some(status) => format!("{:?}", status.code()),
            },
            message: failure.map(|s| s.message().to_string()).unwrap_or_default(),
            access_mode: info
                .capability
                .and_then(|c| c.access_mode.as_ref())
                .and_then(|m| csi::volume_capability::access_mode::Mode::try_from(m.mode).ok())
                .map(|m| m.as_str_name().to_string())
                .unwrap_or_default(),
            volume_mount_group: match info.capability.and_then(|c| c.access_type.as_ref()) {
                Some(csi::volume_capability::AccessType::Mount(m)) => m.volume_mount_group.clone(),
                _ => String::new(),
            },
        }
    }
}

/// The tokens' JSON with every `token` replaced by `<redacted>`: audiences and expiry times stay
/// visible; anything unexpected is redacted whole.
fn redact_tokens(value: &str) -> String {
    let Ok(serde_json::Value::Object(mut audiences)) = serde_json::from_str(value) else {
        return "<redacted>".into();
    };
    for status in audiences.values_mut() {
        match status.as_object_mut() {
            Some(status) => {
                status.insert("token".into(), "<redacted>".into());
            }
            None => *status = "<redacted>".into(),
        }
    }
    serde_json::Value::Object(audiences).to_string()
}

impl CsiClient {
    /// A client for `driver` over `channel`, reporting to `observer`.
    pub fn new(driver: &str, channel: Channel, observer: Option<Arc<dyn CsiObserver>>) -> Self {
        Self {
            driver: driver.to_string(),
            node: NodeClient::new(channel.clone()),
            controller: ControllerClient::new(channel),
            observer,
        }
    }

    /// The driver's name.
    pub fn driver(&self) -> &str {
        &self.driver
    }

    fn report<R: CallRequest>(&self, request: &R, failure: Option<&Status>) {
        if let Some(observer) = &self.observer {
            observer.observe(CsiCall::of(&self.driver, request, failure));
        }
    }

    fn timed<T>(message: T) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(CSI_TIMEOUT);
        request
    }

    /// NodePublishVolume.
    pub async fn node_publish(&self, req: csi::NodePublishVolumeRequest) -> Result<(), Status> {
        let result = self
            .node
            .clone()
            .node_publish_volume(Self::timed(req.clone()))
            .await;
        self.report(&req, result.as_ref().err());
        result.map(drop)
    }

    /// NodeUnpublishVolume (no secrets, no context: the kubelet sends none).
    pub async fn node_unpublish(&self, volume_id: &str, target_path: &str) -> Result<(), Status> {
        let req = csi::NodeUnpublishVolumeRequest {
            volume_id: volume_id.into(),
            target_path: target_path.into(),
        };
        let result = self
            .node
            .clone()
            .node_unpublish_volume(Self::timed(req.clone()))
            .await;
        self.report(&req, result.as_ref().err());
        result.map(drop)
    }

    /// NodeStageVolume.
    pub async fn node_stage(&self, req: csi::NodeStageVolumeRequest) -> Result<(), Status> {
        let result = self
            .node
            .clone()
            .node_stage_volume(Self::timed(req.clone()))
            .await;
        self.report(&req, result.as_ref().err());
        result.map(drop)
    }

    /// NodeUnstageVolume.
    pub async fn node_unstage(&self, volume_id: &str, staging_path: &str) -> Result<(), Status> {
        let req = csi::NodeUnstageVolumeRequest {
            volume_id: volume_id.into(),
            staging_target_path: staging_path.into(),
        };
        let result = self
            .node
            .clone()
            .node_unstage_volume(Self::timed(req.clone()))
            .await;
        self.report(&req, result.as_ref().err());
        result.map(drop)
    }

    /// NodeGetCapabilities, as the RPC types the driver advertises.
    pub async fn node_capabilities(
        &self,
    ) -> Result<Vec<csi::node_service_capability::rpc::Type>, Status> {
        let req = csi::NodeGetCapabilitiesRequest {};
        let result = self
            .node
            .clone()
            .node_get_capabilities(Self::timed(req))
            .await;
        self.report(&req, result.as_ref().err());
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

    /// NodeGetInfo.
    pub async fn node_info(&self) -> Result<csi::NodeGetInfoResponse, Status> {
        let req = csi::NodeGetInfoRequest {};
        let result = self.node.clone().node_get_info(Self::timed(req)).await;
        self.report(&req, result.as_ref().err());
        Ok(result?.into_inner())
    }

    /// ControllerGetCapabilities, as the RPC types the driver advertises.
    pub async fn controller_capabilities(
        &self,
    ) -> Result<Vec<csi::controller_service_capability::rpc::Type>, Status> {
        let req = csi::ControllerGetCapabilitiesRequest {};
        let result = self
            .controller
            .clone()
            .controller_get_capabilities(Self::timed(req))
            .await;
        self.report(&req, result.as_ref().err());
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
        let result = self
            .controller
            .clone()
            .controller_publish_volume(Self::timed(req.clone()))
            .await
            .map(|r| r.into_inner().publish_context);
        if let Some(observer) = &self.observer {
            let mut call = CsiCall::of(&self.driver, &req, result.as_ref().err());
            if let Ok(context) = &result {
                call.publish_context = context
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
            }
            observer.observe(call);
        }
        result
    }

    /// ControllerUnpublishVolume.
    pub async fn controller_unpublish(
        &self,
        req: csi::ControllerUnpublishVolumeRequest,
    ) -> Result<(), Status> {
        let result = self
            .controller
            .clone()
            .controller_unpublish_volume(Self::timed(req.clone()))
            .await;
        self.report(&req, result.as_ref().err());
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
            crate::volume::csi::rpc_error(&status),
            "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
        );
    }
}
