//! The local driver's tonic services: CSI Identity, Controller and Node.
//!
//! Each RPC that touches the host runs its [`LocalDriver`] method on the blocking pool, so filesystem and
//! mount work never stalls the async runtime; those that read only the config are answered at once. Node
//! calls on different volumes run side by side, so the CPUs' syscalls overlap; calls on one volume wait
//! for each other, as the CSI spec asks a driver to keep one operation per volume in flight
//! (csi-driver-host-path serializes everything behind one lock instead). Controller calls read or change
//! many volumes, and run alone. Requests are never logged whole: CSI `secrets` fields would reach the log.
//! Only the call name, its outcome and ids are.

use std::sync::Arc;

use inlet_image::locks::KeyedLocks;
use inlet_proto::csi::v1::{
    self as csi, controller_server::Controller, identity_server::Identity, node_server::Node,
};
use tokio::sync::RwLock;
use tonic::{Request, Response, Status};

use super::LocalDriver;
use inlet_host::error::Result;

/// The local driver behind the three CSI services. Cheap to clone: clones share one driver.
#[derive(Debug, Clone)]
pub struct LocalService {
    driver: Arc<LocalDriver>,
    /// Held alone by controller calls, shared by the others.
    calls: Arc<RwLock<()>>,
    /// One node call per volume id, and per target or staging path, at a time.
    volumes: Arc<KeyedLocks>,
}

/// What a call may run beside.
enum Access {
    /// Nothing: it reads or changes many volumes (controller calls).
    Alone,
    /// Anything but controller calls: it reads no volume.
    Shared,
    /// Calls on other volumes and other paths: the volume's id, and the path the call mounts or unmounts
    /// (two volumes published at one target must not both find it free).
    Volume(String, String),
}

impl Access {
    /// The path as its components spell it (`a//b/` is `a/b`), so two spellings of one target take one
    /// lock; `.` and `..` are refused later, and the kubelet names a volume's paths one way only.
    fn volume(id: &str, path: &str) -> Self {
        let path: std::path::PathBuf = std::path::Path::new(path).components().collect();
        Self::Volume(id.to_string(), path.to_string_lossy().into_owned())
    }
}

impl LocalService {
    /// Serves `driver`.
    pub fn new(driver: LocalDriver) -> Self {
        Self {
            driver: Arc::new(driver),
            calls: Arc::default(),
            volumes: Arc::default(),
        }
    }

    /// Runs a controller call alone (see [`LocalService::run_as`]).
    async fn run<T, F>(&self, call: &'static str, f: F) -> Result<Response<T>, Status>
    where
        T: Send + 'static,
        F: FnOnce(&LocalDriver) -> Result<T> + Send + 'static,
    {
        self.run_as(call, Access::Alone, f).await
    }

    /// Answers a call that reads only the driver's config, which never changes: on the caller's task, with
    /// no lock and no trip to the blocking pool. The kubelet asks NodeGetCapabilities before every publish
    /// and every volume stats call (`csi_client.go`, `NodeSupportsVolumeStats`), so this is most calls.
    fn answer<T>(
        &self,
        call: &'static str,
        f: impl FnOnce(&LocalDriver) -> T,
    ) -> Result<Response<T>, Status> {
        crate::server::reply(call, Ok(f(&self.driver)))
    }

    /// Runs one driver method off the async runtime once `access` allows, and maps its error to a gRPC
    /// status.
    async fn run_as<T, F>(
        &self,
        call: &'static str,
        access: Access,
        f: F,
    ) -> Result<Response<T>, Status>
    where
        T: Send + 'static,
        F: FnOnce(&LocalDriver) -> Result<T> + Send + 'static,
    {
        let calls = Arc::clone(&self.calls);
        let held = match access {
            Access::Alone => (Some(calls.write_owned().await), None, None),
            Access::Shared => (None, Some(calls.read_owned().await), None),
            // Always the volume, then the path: no two calls wait for each other in turn.
            Access::Volume(id, path) => {
                let shared = calls.read_owned().await;
                let volume = self.volumes.lock(&format!("volume {id}")).await;
                let path = self.volumes.lock(&format!("path {path}")).await;
                (None, Some(shared), Some((volume, path)))
            }
        };
        let driver = Arc::clone(&self.driver);
        // The locks go with the work: a caller that gives up (its deadline passed) drops this future, and
        // the next call on the volume must still wait for the work it started.
        let outcome = tokio::task::spawn_blocking(move || {
            let _held = held;
            f(&driver)
        })
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
        self.answer("GetPluginInfo", |d| csi::GetPluginInfoResponse {
            name: d.config().name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        })
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
        self.run_as("Probe", Access::Shared, |d| {
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
        self.answer("ControllerGetCapabilities", |d| {
            csi::ControllerGetCapabilitiesResponse {
                capabilities: d.controller_capabilities(),
            }
        })
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
        let volume = Access::volume(&r.get_ref().volume_id, &r.get_ref().staging_target_path);
        self.run_as("NodeStageVolume", volume, move |d| {
            d.node_stage(r.into_inner())
        })
        .await
    }

    /// Not staged is already unstaged.
    async fn node_unstage_volume(
        &self,
        r: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let volume = Access::volume(&r.get_ref().volume_id, &r.get_ref().staging_target_path);
        self.run_as("NodeUnstageVolume", volume, move |d| {
            d.node_unstage(r.into_inner())
        })
        .await
    }

    /// Publishing again with the same options is OK.
    async fn node_publish_volume(
        &self,
        r: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let volume = Access::volume(&r.get_ref().volume_id, &r.get_ref().target_path);
        self.run_as("NodePublishVolume", volume, move |d| {
            d.node_publish(r.into_inner())
        })
        .await
    }

    /// Not published is already unpublished.
    async fn node_unpublish_volume(
        &self,
        r: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let volume = Access::volume(&r.get_ref().volume_id, &r.get_ref().target_path);
        self.run_as("NodeUnpublishVolume", volume, move |d| {
            d.node_unpublish(r.into_inner())
        })
        .await
    }

    /// Read-only.
    async fn node_get_volume_stats(
        &self,
        r: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        let volume = Access::volume(&r.get_ref().volume_id, &r.get_ref().volume_path);
        self.run_as("NodeGetVolumeStats", volume, move |d| {
            d.node_volume_stats(r.into_inner())
        })
        .await
    }

    /// Repeating it is harmless.
    async fn node_expand_volume(
        &self,
        r: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let volume = Access::volume(&r.get_ref().volume_id, &r.get_ref().volume_path);
        self.run_as("NodeExpandVolume", volume, move |d| {
            d.node_expand(r.into_inner())
        })
        .await
    }

    /// Read-only.
    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        self.answer("NodeGetCapabilities", |d| {
            csi::NodeGetCapabilitiesResponse {
                capabilities: d.node_capabilities(),
            }
        })
    }

    /// Read-only.
    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        self.answer("NodeGetInfo", LocalDriver::node_info)
    }
}

impl crate::metrics::PublishedVolumes for LocalService {
    fn published_modes(&self) -> Vec<&'static str> {
        self.driver
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use inlet_host::mount::RecordingMounter;

    use super::*;
    use crate::keys::EPHEMERAL_KEY;
    use crate::local::LocalConfig;

    const VOLUME_BYTES: u64 = 8 << 20;

    fn service(dir: &std::path::Path, volumes_that_fit: u64) -> LocalService {
        let config = LocalConfig {
            name: "local.inlet.dev".into(),
            node_id: "node".into(),
            state_dir: dir.join("state"),
            kubelet_dir: dir.join("kubelet"),
            capacity_bytes: volumes_that_fit * VOLUME_BYTES,
            max_volume_bytes: VOLUME_BYTES,
            default_volume_bytes: VOLUME_BYTES,
            enable_attach: false,
            ephemeral_default: false,
            volume_mount_group: false,
        };
        std::fs::create_dir_all(&config.kubelet_dir).unwrap();
        let mounter = Arc::new(RecordingMounter::new());
        LocalService::new(LocalDriver::open(config, mounter).unwrap())
    }

    fn publish(dir: &std::path::Path, id: &str, pod: usize) -> csi::NodePublishVolumeRequest {
        let target = dir.join(format!("kubelet/pods/{pod}/volumes/{id}/mount"));
        csi::NodePublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.to_string_lossy().into_owned(),
            volume_capability: Some(csi::VolumeCapability {
                access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
                access_mode: Some(csi::volume_capability::AccessMode {
                    mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
                }),
            }),
            volume_context: HashMap::from([(EPHEMERAL_KEY.to_string(), "true".to_string())]),
            ..Default::default()
        }
    }

    /// Volumes published side by side share the capacity exactly: never more than fit, whatever the order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn volumes_published_side_by_side_never_take_more_than_the_capacity() {
        let dir = tempfile::tempdir().unwrap();
        let service = service(dir.path(), 4);
        let calls = (0..32).map(|i| {
            let (service, request) = (service.clone(), publish(dir.path(), &format!("v{i}"), i));
            tokio::spawn(async move { service.node_publish_volume(Request::new(request)).await })
        });
        let mut codes = Vec::new();
        for call in calls.collect::<Vec<_>>() {
            codes.push(match call.await.unwrap() {
                Ok(_) => tonic::Code::Ok,
                Err(status) => status.code(),
            });
        }
        let published = codes.iter().filter(|c| **c == tonic::Code::Ok).count();
        assert_eq!(published, 4, "{codes:?}");
        assert!(
            codes
                .iter()
                .all(|c| matches!(c, tonic::Code::Ok | tonic::Code::ResourceExhausted)),
            "{codes:?}"
        );
        assert_eq!(service.driver.volumes().len(), 4);
        let content = std::fs::read_dir(dir.path().join("state/volumes")).unwrap();
        assert_eq!(content.count(), 4, "the refused volumes left no content");
    }

    /// Calls on one volume wait for each other: a publish and an unpublish of the same ephemeral volume,
    /// many times over, end with exactly what the last call asked for.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn calls_on_one_volume_run_one_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let service = service(dir.path(), 4);
        let request = publish(dir.path(), "v", 0);
        let unpublish = csi::NodeUnpublishVolumeRequest {
            volume_id: "v".into(),
            target_path: request.target_path.clone(),
        };
        let calls = (0..64).map(|i| {
            let service = service.clone();
            let (publish, unpublish) = (request.clone(), unpublish.clone());
            tokio::spawn(async move {
                match i % 2 {
                    0 => service
                        .node_publish_volume(Request::new(publish))
                        .await
                        .map(drop),
                    _ => service
                        .node_unpublish_volume(Request::new(unpublish))
                        .await
                        .map(drop),
                }
            })
        });
        for call in calls.collect::<Vec<_>>() {
            call.await.unwrap().expect("every call succeeds");
        }
        service
            .node_unpublish_volume(Request::new(unpublish))
            .await
            .unwrap();
        assert!(service.driver.volumes().is_empty());
        let content = std::fs::read_dir(dir.path().join("state/volumes")).unwrap();
        assert_eq!(content.count(), 0, "nothing is left");
    }
}
