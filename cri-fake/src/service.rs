//! The CRI services over [`FakeRuntime`]: `runtime.v1.RuntimeService` and `runtime.v1.ImageService`.
//! Each handler records the call and applies injected faults first ([`FakeRuntime::enter`]); calls this
//! fake does not model (streaming exec, attach, stats, ...) answer UNIMPLEMENTED.

use std::sync::Arc;
use std::time::Duration;

use inlet_proto::runtime::v1::{
    self as cri, image_service_server::ImageService, runtime_service_server::RuntimeService,
};
use tonic::{Request, Response, Status};

use crate::program::Outcome;
use crate::state::{FakeRuntime, now_nanos};

/// Both CRI services, sharing one runtime.
#[derive(Debug, Clone)]
pub struct CriService {
    runtime: Arc<FakeRuntime>,
}

impl CriService {
    /// Serves `runtime`.
    pub fn new(runtime: Arc<FakeRuntime>) -> Self {
        Self { runtime }
    }
}

type Reply<T> = Result<Response<T>, Status>;

fn ok<T>(t: T) -> Reply<T> {
    Ok(Response::new(t))
}

#[tonic::async_trait]
impl RuntimeService for CriService {
    /// The runtime's name and CRI version (`v1`).
    async fn version(&self, _: Request<cri::VersionRequest>) -> Reply<cri::VersionResponse> {
        self.runtime.enter("Version", "").await?;
        ok(cri::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "cri-fake".into(),
            runtime_version: env!("CARGO_PKG_VERSION").into(),
            runtime_api_version: "v1".into(),
        })
    }

    /// RuntimeReady and NetworkReady, both true.
    async fn status(&self, _: Request<cri::StatusRequest>) -> Reply<cri::StatusResponse> {
        self.runtime.enter("Status", "").await?;
        let condition = |t: &str| cri::RuntimeCondition {
            r#type: t.into(),
            status: true,
            ..Default::default()
        };
        ok(cri::StatusResponse {
            status: Some(cri::RuntimeStatus {
                conditions: vec![condition("RuntimeReady"), condition("NetworkReady")],
            }),
            ..Default::default()
        })
    }

    /// A ready sandbox; its name (pod, namespace, uid, attempt) can be held by one sandbox only.
    async fn run_pod_sandbox(
        &self,
        r: Request<cri::RunPodSandboxRequest>,
    ) -> Reply<cri::RunPodSandboxResponse> {
        let r = r.into_inner();
        let config = r
            .config
            .ok_or_else(|| Status::invalid_argument("config is required"))?;
        let subject = config
            .metadata
            .as_ref()
            .map(|m| format!("{}/{}", m.namespace, m.name))
            .unwrap_or_default();
        self.runtime.enter("RunPodSandbox", &subject).await?;
        let pod_sandbox_id = self.runtime.run_sandbox(config, r.runtime_handler)?;
        ok(cri::RunPodSandboxResponse { pod_sandbox_id })
    }

    /// Idempotent: a missing or stopped sandbox is OK.
    async fn stop_pod_sandbox(
        &self,
        r: Request<cri::StopPodSandboxRequest>,
    ) -> Reply<cri::StopPodSandboxResponse> {
        let id = r.into_inner().pod_sandbox_id;
        self.runtime.enter("StopPodSandbox", &id).await?;
        self.runtime.stop_sandbox(&id);
        ok(cri::StopPodSandboxResponse {})
    }

    /// Idempotent: a missing sandbox is OK; a ready one must be stopped first.
    async fn remove_pod_sandbox(
        &self,
        r: Request<cri::RemovePodSandboxRequest>,
    ) -> Reply<cri::RemovePodSandboxResponse> {
        let id = r.into_inner().pod_sandbox_id;
        self.runtime.enter("RemovePodSandbox", &id).await?;
        self.runtime.remove_sandbox(&id)?;
        ok(cri::RemovePodSandboxResponse {})
    }

    /// NOT_FOUND for an unknown sandbox.
    async fn pod_sandbox_status(
        &self,
        r: Request<cri::PodSandboxStatusRequest>,
    ) -> Reply<cri::PodSandboxStatusResponse> {
        let id = r.into_inner().pod_sandbox_id;
        self.runtime.enter("PodSandboxStatus", &id).await?;
        let s = self.runtime.sandbox(&id)?.sandbox;
        let status = cri::PodSandboxStatus {
            id: s.id,
            metadata: s.metadata,
            state: s.state,
            created_at: s.created_at,
            network: Some(cri::PodSandboxNetworkStatus {
                ip: "10.88.0.2".into(),
                ..Default::default()
            }),
            linux: None,
            labels: s.labels,
            annotations: s.annotations,
            runtime_handler: s.runtime_handler,
        };
        ok(cri::PodSandboxStatusResponse {
            status: Some(status),
            timestamp: now_nanos(),
            ..Default::default()
        })
    }

    /// Filtered by id, state and labels.
    async fn list_pod_sandbox(
        &self,
        r: Request<cri::ListPodSandboxRequest>,
    ) -> Reply<cri::ListPodSandboxResponse> {
        self.runtime.enter("ListPodSandbox", "").await?;
        let filter = r.into_inner().filter.unwrap_or_default();
        let items = self
            .runtime
            .sandboxes()
            .into_iter()
            .map(|s| s.sandbox)
            .filter(|s| filter.id.is_empty() || s.id == filter.id)
            .filter(|s| filter.state.as_ref().is_none_or(|v| v.state == s.state))
            .filter(|s| {
                filter
                    .label_selector
                    .iter()
                    .all(|(k, v)| s.labels.get(k) == Some(v))
            })
            .collect();
        ok(cri::ListPodSandboxResponse { items })
    }

    /// Needs a ready sandbox, a pulled image and existing host paths.
    async fn create_container(
        &self,
        r: Request<cri::CreateContainerRequest>,
    ) -> Reply<cri::CreateContainerResponse> {
        let r = r.into_inner();
        let config = r
            .config
            .ok_or_else(|| Status::invalid_argument("config is required"))?;
        let subject = config
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        self.runtime.enter("CreateContainer", &subject).await?;
        let container_id = self.runtime.create_container(&r.pod_sandbox_id, config)?;
        ok(cri::CreateContainerResponse { container_id })
    }

    /// A created container starts; NOT_FOUND for an unknown one.
    async fn start_container(
        &self,
        r: Request<cri::StartContainerRequest>,
    ) -> Reply<cri::StartContainerResponse> {
        let id = r.into_inner().container_id;
        self.runtime.enter("StartContainer", &id).await?;
        self.runtime.start_container(&id)?;
        ok(cri::StartContainerResponse {})
    }

    /// Idempotent: a missing or exited container is OK.
    async fn stop_container(
        &self,
        r: Request<cri::StopContainerRequest>,
    ) -> Reply<cri::StopContainerResponse> {
        let id = r.into_inner().container_id;
        self.runtime.enter("StopContainer", &id).await?;
        self.runtime.stop_container(&id);
        ok(cri::StopContainerResponse {})
    }

    /// Idempotent: a missing container is OK.
    async fn remove_container(
        &self,
        r: Request<cri::RemoveContainerRequest>,
    ) -> Reply<cri::RemoveContainerResponse> {
        let id = r.into_inner().container_id;
        self.runtime.enter("RemoveContainer", &id).await?;
        self.runtime.remove_container(&id);
        ok(cri::RemoveContainerResponse {})
    }

    /// Filtered by id, state, sandbox and labels.
    async fn list_containers(
        &self,
        r: Request<cri::ListContainersRequest>,
    ) -> Reply<cri::ListContainersResponse> {
        self.runtime.enter("ListContainers", "").await?;
        let filter = r.into_inner().filter.unwrap_or_default();
        // Filtered before anything is copied: kubelets relist often, and most containers do not match.
        let containers = self
            .runtime
            .containers_where(|c| {
                (filter.id.is_empty() || c.status.id == filter.id)
                    && (filter.pod_sandbox_id.is_empty() || c.sandbox_id == filter.pod_sandbox_id)
                    && filter
                        .state
                        .as_ref()
                        .is_none_or(|v| v.state == c.status.state)
                    && filter
                        .label_selector
                        .iter()
                        .all(|(k, v)| c.status.labels.get(k) == Some(v))
            })
            .into_iter()
            .map(|c| cri::Container {
                id: c.status.id,
                pod_sandbox_id: c.sandbox_id,
                metadata: c.status.metadata,
                image: c.status.image,
                image_ref: c.status.image_ref,
                state: c.status.state,
                created_at: c.status.created_at,
                labels: c.status.labels,
                annotations: c.status.annotations,
                image_id: c.status.image_id,
            })
            .collect();
        ok(cri::ListContainersResponse { containers })
    }

    /// Runs a command in a running container as [`crate::program`] understands it: its output and exit
    /// code after the time it takes. One that would not end runs until the container stops (exit code
    /// 137) or the timeout passes (DEADLINE_EXCEEDED, containerd's text); a timeout of 0 is none.
    async fn exec_sync(&self, r: Request<cri::ExecSyncRequest>) -> Reply<cri::ExecSyncResponse> {
        let r = r.into_inner();
        self.runtime.enter("ExecSync", &r.container_id).await?;
        let deadline = (r.timeout > 0).then(|| Duration::from_secs(r.timeout as u64));
        let timed_out = || {
            Status::deadline_exceeded(format!(
                "failed to exec in container: timeout {}s exceeded: context deadline exceeded",
                r.timeout
            ))
        };
        match self.runtime.exec(&r.container_id, &r.cmd)? {
            Outcome::Exits {
                code,
                after,
                output,
            } => {
                if let Some(deadline) = deadline.filter(|d| *d < after) {
                    tokio::time::sleep(deadline).await;
                    return Err(timed_out());
                }
                tokio::time::sleep(after).await;
                let mut stdout = output.join("\n").into_bytes();
                if !stdout.is_empty() {
                    stdout.push(b'\n');
                }
                ok(cri::ExecSyncResponse {
                    stdout,
                    stderr: Vec::new(),
                    exit_code: code,
                })
            }
            Outcome::RunsUntilStopped => {
                let started = std::time::Instant::now();
                while self.runtime.is_running(&r.container_id) {
                    if deadline.is_some_and(|d| started.elapsed() >= d) {
                        return Err(timed_out());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                ok(cri::ExecSyncResponse {
                    exit_code: 137,
                    ..Default::default()
                })
            }
        }
    }

    /// The status with its mounts; NOT_FOUND for an unknown container.
    async fn container_status(
        &self,
        r: Request<cri::ContainerStatusRequest>,
    ) -> Reply<cri::ContainerStatusResponse> {
        let id = r.into_inner().container_id;
        self.runtime.enter("ContainerStatus", &id).await?;
        let status = self.runtime.container(&id)?.status;
        ok(cri::ContainerStatusResponse {
            status: Some(status),
            ..Default::default()
        })
    }
}

#[tonic::async_trait]
impl ImageService for CriService {
    /// All images, or those matching the filter's reference.
    async fn list_images(
        &self,
        r: Request<cri::ListImagesRequest>,
    ) -> Reply<cri::ListImagesResponse> {
        self.runtime.enter("ListImages", "").await?;
        let reference = r
            .into_inner()
            .filter
            .and_then(|f| f.image)
            .map(|i| i.image)
            .filter(|i| !i.is_empty());
        ok(cri::ListImagesResponse {
            images: match reference.as_deref() {
                Some(r) => self.runtime.images().get(r).into_iter().collect(),
                None => self.runtime.images().list(),
            },
        })
    }

    /// `image` is None when the image is not present: not an error, as the CRI says.
    async fn image_status(
        &self,
        r: Request<cri::ImageStatusRequest>,
    ) -> Reply<cri::ImageStatusResponse> {
        let reference = r.into_inner().image.map(|i| i.image).unwrap_or_default();
        self.runtime.enter("ImageStatus", &reference).await?;
        ok(cri::ImageStatusResponse {
            image: self.runtime.images().get(&reference),
            ..Default::default()
        })
    }

    /// Pulls the image (real content from configured registries; pulling again is harmless).
    /// Credentials are never logged or stored.
    async fn pull_image(&self, r: Request<cri::PullImageRequest>) -> Reply<cri::PullImageResponse> {
        let r = r.into_inner();
        let reference = r.image.map(|i| i.image).unwrap_or_default();
        self.runtime.enter("PullImage", &reference).await?;
        let image_ref = self
            .runtime
            .images()
            .pull(&reference, r.auth.as_ref())
            .await?;
        tracing::info!(image = reference, image_ref, "pulled image");
        ok(cri::PullImageResponse { image_ref })
    }

    /// Idempotent: a missing image is OK.
    async fn remove_image(
        &self,
        r: Request<cri::RemoveImageRequest>,
    ) -> Reply<cri::RemoveImageResponse> {
        let reference = r.into_inner().image.map(|i| i.image).unwrap_or_default();
        self.runtime.enter("RemoveImage", &reference).await?;
        self.runtime.remove_image(&reference)?;
        ok(cri::RemoveImageResponse {})
    }

    /// The image filesystem: the runtime's root dir.
    async fn image_fs_info(
        &self,
        _: Request<cri::ImageFsInfoRequest>,
    ) -> Reply<cri::ImageFsInfoResponse> {
        self.runtime.enter("ImageFsInfo", "").await?;
        let images = self.runtime.images().list();
        let used: u64 = images.iter().map(|i| i.size).sum();
        let usage = cri::FilesystemUsage {
            timestamp: now_nanos(),
            fs_id: Some(cri::FilesystemIdentifier {
                mountpoint: self
                    .runtime
                    .images()
                    .root()
                    .join("overlay-images")
                    .display()
                    .to_string(),
            }),
            used_bytes: Some(cri::UInt64Value { value: used }),
            inodes_used: Some(cri::UInt64Value {
                value: images.len() as u64,
            }),
        };
        ok(cri::ImageFsInfoResponse {
            image_filesystems: vec![usage],
            container_filesystems: Vec::new(),
        })
    }
}
