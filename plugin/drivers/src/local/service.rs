//! The local driver's tonic services: CSI Identity, Controller and Node.
//!
//! Each RPC runs its [`LocalDriver`] method on the blocking pool under one lock, so filesystem and mount work
//! never stalls the async runtime and operations never interleave. Requests are never logged whole: CSI
//! `secrets` fields would reach the log. Only the call name, its outcome and ids are.

use std::sync::Arc;

use inlet_proto::csi::v1::{
    self as csi, controller_server::Controller, identity_server::Identity, node_server::Node,
};
use parking_lot::Mutex;
use tonic::{Request, Response, Status};

use super::LocalDriver;
use inlet_host::error::Result;

/// The local driver behind the three CSI services. Cheap to clone: clones share one driver.
#[derive(Debug, Clone)]
pub struct LocalService {
    driver: Arc<Mutex<LocalDriver>>,
}

impl LocalService {
    /// Serves `driver`.
    pub fn new(driver: LocalDriver) -> Self {
        Self {
            driver: Arc::new(Mutex::new(driver)),
        }
    }

    /// Runs one driver method off the async runtime and maps its error to a gRPC status.
    async fn run<T, F>(&self, call: &'static str, f: F) -> Result<Response<T>, Status>
    where
        T: Send + 'static,
        F: FnOnce(&mut LocalDriver) -> Result<T> + Send + 'static,
    {
        let driver = Arc::clone(&self.driver);
        let outcome = tokio::task::spawn_blocking(move || f(&mut driver.lock()))
            .await
            .map_err(|e| Status::internal(format!("{call} failed unexpectedly: {e}")))?;
        crate::server::reply(call, outcome)
    }
}

#[tonic::async_trait]
impl Identity for LocalService {
    /// Always answers with the configured name; no state changes.
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        self.run("GetPluginInfo", |d| {
            Ok(csi::GetPluginInfoResponse {
                name: d.config().name.clone(),
                vendor_version: env!("CARGO_PKG_VERSION").to_string(),
                manifest: Default::default(),
            })
        })
        .await
    }

    /// The controller service and online expansion; no state changes.
    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        use csi::plugin_capability::{Service, Type, VolumeExpansion, service, volume_expansion};
        let capabilities = vec![
            csi::PluginCapability {
                r#type: Some(Type::Service(Service {
                    r#type: service::Type::ControllerService as i32,
                })),
            },
            csi::PluginCapability {
                r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                    r#type: volume_expansion::Type::Online as i32,
                })),
            },
        ];
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    /// Ready when the state dir is reachable; no state changes.
    async fn probe(
        &self,
        _: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        self.run("Probe", |d| {
            Ok(csi::ProbeResponse {
                ready: Some(d.config().state_dir.is_dir()),
            })
        })
        .await
    }
}

#[tonic::async_trait]
impl Controller for LocalService {
    /// Idempotent by name (see [`LocalDriver::create_volume`]).
    async fn create_volume(
        &self,
        r: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        self.run("CreateVolume", move |d| d.create_volume(r.into_inner()))
            .await
    }

    /// An unknown id is already deleted.
    async fn delete_volume(
        &self,
        r: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        self.run("DeleteVolume", move |d| d.delete_volume(r.into_inner()))
            .await
    }

    /// Repeats for the same node and flags are OK.
    async fn controller_publish_volume(
        &self,
        r: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        self.run("ControllerPublishVolume", move |d| {
            d.controller_publish(r.into_inner())
        })
        .await
    }

    /// Not published is already unpublished.
    async fn controller_unpublish_volume(
        &self,
        r: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        self.run("ControllerUnpublishVolume", move |d| {
            d.controller_unpublish(r.into_inner())
        })
        .await
    }

    /// Read-only.
    async fn validate_volume_capabilities(
        &self,
        r: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        self.run("ValidateVolumeCapabilities", move |d| {
            d.validate_volume_capabilities(r.into_inner())
        })
        .await
    }

    /// Read-only; tokens are stable while nothing is created or deleted.
    async fn list_volumes(
        &self,
        r: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        self.run("ListVolumes", move |d| d.list_volumes(r.into_inner()))
            .await
    }

    /// Read-only.
    async fn get_capacity(
        &self,
        r: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        self.run("GetCapacity", move |d| d.get_capacity(r.into_inner()))
            .await
    }

    /// Read-only.
    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        self.run("ControllerGetCapabilities", |d| {
            Ok(csi::ControllerGetCapabilitiesResponse {
                capabilities: d.controller_capabilities(),
            })
        })
        .await
    }

    /// Idempotent by name.
    async fn create_snapshot(
        &self,
        r: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        self.run("CreateSnapshot", move |d| d.create_snapshot(r.into_inner()))
            .await
    }

    /// An unknown id is already deleted.
    async fn delete_snapshot(
        &self,
        r: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        self.run("DeleteSnapshot", move |d| d.delete_snapshot(r.into_inner()))
            .await
    }

    /// Read-only.
    async fn list_snapshots(
        &self,
        r: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        self.run("ListSnapshots", move |d| d.list_snapshots(r.into_inner()))
            .await
    }

    /// Growing to a size already reached is OK.
    async fn controller_expand_volume(
        &self,
        r: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        self.run("ControllerExpandVolume", move |d| {
            d.controller_expand(r.into_inner())
        })
        .await
    }

    /// Read-only.
    async fn controller_get_volume(
        &self,
        r: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        self.run("ControllerGetVolume", move |d| {
            d.controller_get_volume(r.into_inner())
        })
        .await
    }
}

#[tonic::async_trait]
impl Node for LocalService {
    /// Staging again at the same path is OK.
    async fn node_stage_volume(
        &self,
        r: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        self.run("NodeStageVolume", move |d| d.node_stage(r.into_inner()))
            .await
    }

    /// Not staged is already unstaged.
    async fn node_unstage_volume(
        &self,
        r: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        self.run("NodeUnstageVolume", move |d| d.node_unstage(r.into_inner()))
            .await
    }

    /// Publishing again with the same options is OK.
    async fn node_publish_volume(
        &self,
        r: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        self.run("NodePublishVolume", move |d| d.node_publish(r.into_inner()))
            .await
    }

    /// Not published is already unpublished.
    async fn node_unpublish_volume(
        &self,
        r: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        self.run("NodeUnpublishVolume", move |d| {
            d.node_unpublish(r.into_inner())
        })
        .await
    }

    /// Read-only.
    async fn node_get_volume_stats(
        &self,
        r: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        self.run("NodeGetVolumeStats", move |d| {
            d.node_volume_stats(r.into_inner())
        })
        .await
    }

    /// Repeating it is harmless.
    async fn node_expand_volume(
        &self,
        r: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        self.run("NodeExpandVolume", move |d| d.node_expand(r.into_inner()))
            .await
    }

    /// Read-only.
    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        self.run("NodeGetCapabilities", |d| {
            Ok(csi::NodeGetCapabilitiesResponse {
                capabilities: d.node_capabilities(),
            })
        })
        .await
    }

    /// Read-only.
    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        self.run("NodeGetInfo", |d| Ok(d.node_info())).await
    }
}

impl crate::metrics::PublishedVolumes for LocalService {
    fn published_modes(&self) -> Vec<&'static str> {
        let driver = self.driver.lock();
        driver
            .volumes()
            .values()
            .flat_map(|volume| {
                let mode = if volume.ephemeral {
                    "ephemeral"
                } else {
                    "persistent"
                };
                std::iter::repeat_n(mode, volume.published.len())
            })
            .collect()
    }
}
