//! A CSI driver that lies, for the tests of what the kubelet side and conform do with one: it answers
//! Identity and Node calls as a plain ephemeral-volume driver would, except for NodePublishVolume, which
//! misbehaves as its [`Misbehaviour`] says. It mounts nothing itself.

use std::path::{Path, PathBuf};

use inlet_proto::csi::v1 as csi;
use inlet_proto::csi::v1::identity_server::{Identity, IdentityServer};
use inlet_proto::csi::v1::node_server::{Node, NodeServer};
use tonic::{Request, Response, Status};

/// What the driver does with NodePublishVolume.
#[derive(Debug, Clone)]
pub enum Misbehaviour {
    /// Puts a symlink to this host directory where the target directory should be, and answers OK.
    SymlinkTarget(PathBuf),
    /// Never answers.
    Hang,
    /// Fails with INTERNAL and this message.
    Error(String),
}

#[derive(Debug, Clone)]
struct Hostile {
    name: String,
    misbehaviour: Misbehaviour,
}

#[tonic::async_trait]
impl Identity for Hostile {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: "0.0.1".into(),
            ..Default::default()
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(Default::default()))
    }

    async fn probe(
        &self,
        _: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Node for Hostile {
    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(Default::default()))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: "hostile-node".into(),
            ..Default::default()
        }))
    }

    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let target = PathBuf::from(request.into_inner().target_path);
        match &self.misbehaviour {
            Misbehaviour::SymlinkTarget(host) => {
                let _ = std::fs::remove_dir(&target);
                if std::fs::symlink_metadata(&target).is_err() {
                    std::os::unix::fs::symlink(host, &target)
                        .map_err(|e| Status::internal(e.to_string()))?;
                }
                Ok(Response::new(Default::default()))
            }
            Misbehaviour::Hang => std::future::pending().await,
            Misbehaviour::Error(message) => Err(Status::internal(message.clone())),
        }
    }

    /// Removes what it left at the target (a symlink, never what it points to), as an honest driver would.
    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let target = PathBuf::from(request.into_inner().target_path);
        match std::fs::symlink_metadata(&target) {
            Ok(m) if m.file_type().is_symlink() => std::fs::remove_file(&target),
            Ok(_) => std::fs::remove_dir(&target),
            Err(_) => Ok(()),
        }
        .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(Default::default()))
    }
}

/// Serves the hostile driver `name` on `dir/<name>.sock` until the test's runtime ends.
pub async fn serve_hostile_driver(dir: &Path, name: &str, misbehaviour: Misbehaviour) -> PathBuf {
    let socket = dir.join(format!("{name}.sock"));
    let incoming = inlet_proto::uds::listen(&socket)
        .await
        .expect("the driver's socket");
    let driver = Hostile {
        name: name.into(),
        misbehaviour,
    };
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(IdentityServer::new(driver.clone()))
            .add_service(NodeServer::new(driver))
            .serve_with_incoming(incoming)
            .await;
    });
    socket
}
