//! The CRI client the pod workers use: RuntimeService and ImageService over one unix socket (cri-fake or
//! a real runtime such as containerd); and the in-process cri-fake a simulation serves without `--cri`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cri_fake::FakeRuntime;
use cri_fake::pull::Registries;

use inlet_proto::codec::unary_boxed;
use inlet_proto::runtime::v1::{
    CreateContainerRequest, CreateContainerResponse, RunPodSandboxRequest, RunPodSandboxResponse,
    image_service_client::ImageServiceClient, runtime_service_client::RuntimeServiceClient,
};
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::images::SimImages;

/// Both CRI services. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Cri {
    /// RuntimeService.
    pub runtime: RuntimeServiceClient<Channel>,
    /// ImageService.
    pub image: ImageServiceClient<Channel>,
    /// RuntimeService without the request timeout, for ExecSync: its deadline is the command's own
    /// (`remote_runtime.go` ExecSync sets none for a timeout of 0, as lifecycle hooks ask).
    pub exec: RuntimeServiceClient<Channel>,
    /// The runtime's name as CRI Version reports it (`containerd`, `cri-o`): the scheme of the
    /// `containerID`s in pod statuses (`kubecontainer.ContainerID`); `cri` when Version does not answer.
    pub runtime_name: String,
    /// The runtime's version as CRI Version reports it (`v2.1.5`, `1.32.4`); empty when it does not answer.
    pub runtime_version: String,
    /// The channel `runtime` calls on, for the calls made with their request on the heap.
    runtime_channel: Channel,
}

impl Cri {
    /// Connects to the runtime on `socket`. A RuntimeService call that takes longer than
    /// `runtime_timeout` fails with DEADLINE_EXCEEDED (`remote_runtime.go` gives each its
    /// `runtimeRequestTimeout`); ImageService calls have no deadline, since a pull may take long, and
    /// neither has `exec`.
    pub async fn connect(
        socket: &Path,
        runtime_timeout: Duration,
    ) -> Result<Self, inlet_proto::uds::EndpointError> {
        let runtime = inlet_proto::uds::connect_with_timeout(socket, Some(runtime_timeout)).await?;
        let image = inlet_proto::uds::connect(socket).await?;
        let runtime_channel = runtime.clone();
        let mut runtime = RuntimeServiceClient::new(runtime);
        let request = inlet_proto::runtime::v1::VersionRequest {
            version: "v1".into(),
        };
        let (runtime_name, runtime_version) = match runtime.version(request).await {
            Ok(v) => {
                let v = v.into_inner();
                (v.runtime_name, v.runtime_version)
            }
            Err(_) => ("cri".into(), String::new()),
        };
        Ok(Self {
            runtime,
            exec: RuntimeServiceClient::new(image.clone()),
            image: ImageServiceClient::new(image),
            runtime_name,
            runtime_version,
            runtime_channel,
        })
    }

    /// RunPodSandbox, its request on the heap while in flight ([`unary_boxed`]): a node starts all its
    /// pods at once.
    pub async fn run_pod_sandbox(
        &self,
        request: RunPodSandboxRequest,
    ) -> Result<RunPodSandboxResponse, Status> {
        let path = "/runtime.v1.RuntimeService/RunPodSandbox";
        unary_boxed(
            self.runtime_channel.clone(),
            path,
            Request::new(Box::new(request)),
        )
        .await
    }

    /// CreateContainer, its request on the heap while in flight ([`unary_boxed`]).
    pub async fn create_container(
        &self,
        request: CreateContainerRequest,
    ) -> Result<CreateContainerResponse, Status> {
        let path = "/runtime.v1.RuntimeService/CreateContainer";
        unary_boxed(
            self.runtime_channel.clone(),
            path,
            Request::new(Box::new(request)),
        )
        .await
    }
}

/// Connects to the runtime on `socket`, retrying for up to 5 s while it starts (an in-process cri-fake
/// binds its socket in the background).
pub async fn connect_when_up(socket: &Path, runtime_timeout: Duration) -> Result<Cri, CriError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match Cri::connect(socket, runtime_timeout).await {
            Ok(cri) => return Ok(cri),
            Err(source) if Instant::now() >= deadline => {
                return Err(CriError::Connect {
                    socket: socket.to_path_buf(),
                    source,
                });
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// The runtime as a Node reports it: `<name>://<version>` (CRI Version); empty when it does not answer.
pub async fn runtime_version(socket: &Path) -> String {
    let Ok(mut cri) = Cri::connect(socket, Duration::from_secs(10)).await else {
        return String::new();
    };
    let request = inlet_proto::runtime::v1::VersionRequest {
        version: "v1".into(),
    };
    match cri.runtime.version(request).await {
        Ok(v) => {
            let v = v.into_inner();
            format!("{}://{}", v.runtime_name, v.runtime_version)
        }
        Err(_) => String::new(),
    }
}

/// The in-process runtime a simulation runs without `--cri`: a cri-fake under `root`, with the images
/// given imported, served on `root/cri.sock` by [`serve_fake`].
pub fn start_fake(
    root: &Path,
    images: &SimImages,
) -> Result<(PathBuf, Arc<FakeRuntime>), CriError> {
    let registries = Registries {
        secure: Vec::new(),
        insecure: images.insecure_registries.clone(),
    };
    let runtime = FakeRuntime::with_registries(root.to_path_buf(), Default::default(), registries)
        .map_err(CriError::Fake)?;
    for (repository, dir) in &images.layouts {
        runtime
            .images()
            .import_layout(dir, repository)
            .map_err(|source| CriError::Layout {
                repository: repository.clone(),
                dir: dir.clone(),
                source,
            })?;
    }
    Ok((root.join("cri.sock"), Arc::new(runtime)))
}

/// The in-process runtime's server: its stop signal and task.
pub type RuntimeServer = (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
);

/// Serves `runtime` on `socket` in the background, until the returned sender is used (or dropped).
pub fn serve_fake(runtime: Arc<FakeRuntime>, socket: &Path) -> RuntimeServer {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let path = socket.to_path_buf();
    let task = tokio::spawn(async move {
        let _ = cri_fake::serve(&path, runtime, async move { drop(stopped.await) }).await;
    });
    (stop, task)
}

/// Why the runtime cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// Its socket did not answer.
    #[error("CRI runtime: {source}")]
    Connect {
        /// The runtime's socket.
        socket: PathBuf,
        /// What dialing it said.
        #[source]
        source: inlet_proto::uds::EndpointError,
    },
    /// The in-process cri-fake could not open its storage.
    #[error("cri-fake: {0}")]
    Fake(#[source] std::io::Error),
    /// An OCI layout given with `--image-layout` could not be imported.
    #[error("image layout {repository}={}: {source}", dir.display())]
    Layout {
        /// The repository its tags are imported as.
        repository: String,
        /// The layout's directory.
        dir: PathBuf,
        /// What the import said.
        #[source]
        source: std::io::Error,
    },
}
