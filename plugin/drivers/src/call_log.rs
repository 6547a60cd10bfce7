//! `inlet-plugin serve --call-log FILE`: every Node call the driver receives, one JSON line each, in the
//! form kubelet-sim's report gives CSI calls ([`CsiCall`]): secrets by key name only, service-account
//! tokens redacted. It shows what a real kubelet sends, to compare with kubelet-sim (the differential test
//! against the kit's kubelet reads it) or to debug a node.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use inlet_proto::csi::v1::{self as csi, node_server::Node};
use tonic::{Request, Response, Status};

use inlet_proto::csi_call::{CallRequest, CsiCall};

/// An append-only file of [`CsiCall`]s as JSON lines.
#[derive(Debug)]
pub struct CallLog {
    driver: String,
    file: Mutex<File>,
}

impl CallLog {
    /// Appends to `path` (created if missing, mode 0600), recording calls to `driver`.
    pub fn open(path: &Path, driver: &str) -> io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        Ok(Self {
            driver: driver.to_string(),
            file: Mutex::new(file),
        })
    }

    /// Reads back a call log.
    pub fn read(path: &Path) -> io::Result<Vec<CsiCall>> {
        std::fs::read_to_string(path)?
            .lines()
            .map(|line| serde_json::from_str(line).map_err(io::Error::other))
            .collect()
    }

    fn record<R: CallRequest>(&self, request: &R, failure: Option<&Status>) {
        let call = CsiCall::of(&self.driver, request, failure);
        let Ok(mut line) = serde_json::to_vec(&call) else {
            return;
        };
        line.push(b'\n');
        // One write per line, so concurrent calls never interleave; a full disk loses a line, not a call.
        let written = self.file.lock().map(|mut f| f.write_all(&line));
        if let Ok(Err(e)) = written {
            tracing::warn!("call log: {e}");
        }
    }
}

/// A Node service that records each call in a [`CallLog`], then answers as `inner` does.
#[derive(Debug, Clone)]
pub struct LoggedNode<N> {
    inner: N,
    log: Arc<CallLog>,
}

impl<N> LoggedNode<N> {
    /// `inner`, its calls recorded in `log`.
    pub fn new(inner: N, log: Arc<CallLog>) -> Self {
        Self { inner, log }
    }
}

macro_rules! logged {
    ($($method:ident($request:ty) -> $response:ty;)*) => {
        #[tonic::async_trait]
        impl<N: Node> Node for LoggedNode<N> {
            $(
                async fn $method(&self, request: Request<$request>) -> Result<Response<$response>, Status> {
                    let message = request.get_ref().clone();
                    let result = self.inner.$method(request).await;
                    self.log.record(&message, result.as_ref().err());
                    result
                }
            )*
        }
    };
}

logged! {
    node_stage_volume(csi::NodeStageVolumeRequest) -> csi::NodeStageVolumeResponse;
    node_unstage_volume(csi::NodeUnstageVolumeRequest) -> csi::NodeUnstageVolumeResponse;
    node_publish_volume(csi::NodePublishVolumeRequest) -> csi::NodePublishVolumeResponse;
    node_unpublish_volume(csi::NodeUnpublishVolumeRequest) -> csi::NodeUnpublishVolumeResponse;
    node_get_volume_stats(csi::NodeGetVolumeStatsRequest) -> csi::NodeGetVolumeStatsResponse;
    node_expand_volume(csi::NodeExpandVolumeRequest) -> csi::NodeExpandVolumeResponse;
    node_get_capabilities(csi::NodeGetCapabilitiesRequest) -> csi::NodeGetCapabilitiesResponse;
    node_get_info(csi::NodeGetInfoRequest) -> csi::NodeGetInfoResponse;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::{LocalConfig, LocalDriver, LocalService};
    use inlet_host::mount::RecordingMounter;
    use std::collections::HashMap;

    #[tokio::test]
    async fn records_each_call_with_secret_names_only() {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = dir.path().join("kubelet");
        std::fs::create_dir_all(&kubelet).unwrap();
        let config = LocalConfig {
            name: "local.inlet.dev".into(),
            node_id: "node-1".into(),
            state_dir: dir.path().join("state"),
            kubelet_dir: kubelet.clone(),
            capacity_bytes: 1 << 30,
            max_volume_bytes: 1 << 30,
            default_volume_bytes: 1 << 20,
            enable_attach: false,
            ephemeral_default: false,
            volume_mount_group: false,
        };
        let driver = LocalDriver::open(config, Arc::new(RecordingMounter::new())).unwrap();
        let path = dir.path().join("calls.jsonl");
        let log = Arc::new(CallLog::open(&path, "local.inlet.dev").unwrap());
        let node = LoggedNode::new(LocalService::new(driver), log);
        let target = kubelet.join("pods/uid/volumes/kubernetes.io~csi/data/mount");
        let publish = csi::NodePublishVolumeRequest {
            volume_id: "csi-abc".into(),
            target_path: target.display().to_string(),
            volume_capability: Some(csi::VolumeCapability {
                access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
                access_mode: Some(csi::volume_capability::AccessMode { mode: 1 }),
            }),
            volume_context: HashMap::from([(
                "csi.storage.k8s.io/ephemeral".to_string(),
                "true".to_string(),
            )]),
            secrets: HashMap::from([("password".to_string(), "s3cret-value".to_string())]),
            ..Default::default()
        };
        node.node_publish_volume(Request::new(publish))
            .await
            .unwrap();
        let unpublish = csi::NodeUnpublishVolumeRequest {
            volume_id: "csi-abc".into(),
            target_path: target.display().to_string(),
        };
        node.node_unpublish_volume(Request::new(unpublish.clone()))
            .await
            .unwrap();
        node.node_unpublish_volume(Request::new(csi::NodeUnpublishVolumeRequest::default()))
            .await
            .unwrap_err();
        let calls = CallLog::read(&path).unwrap();
        let summary: Vec<_> = calls
            .iter()
            .map(|c| (c.method.as_str(), c.code.as_str()))
            .collect();
        assert_eq!(
            summary,
            [
                ("NodePublishVolume", "OK"),
                ("NodeUnpublishVolume", "OK"),
                ("NodeUnpublishVolume", "InvalidArgument")
            ]
        );
        assert_eq!(calls[0].secret_keys, ["password"]);
        assert_eq!(calls[0].access_mode, "SINGLE_NODE_WRITER");
        assert!(!std::fs::read_to_string(&path).unwrap().contains("s3cret"));
    }
}
