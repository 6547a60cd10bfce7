//! Image volumes: a container image's files mounted as a volume, pulled through the runtime's CRI so its
//! registry configuration applies, and mounted from the runtime's own storage so no copy is made.
//!
//! One engine, two front doors: the `image` CSI driver (`inlet_plugin::image`, served by `inlet-plugin serve
//! --driver image`) and the kubelet-side in-tree plugin (`inlet_volume::image`).
//!
//! # Layout
//! - [`auth`]: registry credentials from pull secrets and CSI secrets, matched to an image's registry.
//! - [`pull`]: [`Puller`]: CRI pulls with pull policies, background pulls past a caller's deadline, and the
//!   check that a cached private image goes only to callers with credentials for it.
//! - [`pull_records`]: who pulled what, in the kubelet's own record (`image_manager/`); [`allowlist`]: the
//!   images `NeverVerifyAllowlistedImages` exempts.
//! - [`metrics`]: pulls by result (count, bytes, seconds) and the pull record's decisions, for Prometheus.
//! - [`store`]: where the runtime keeps images: containerd's snapshots or containers/storage's layers.
//! - `locks`: one async lock per target or store key, so volumes of other images never wait on each other.
//! - [`volumes`]: [`ImageVolumes`]: shared read-only views, writable copy-on-write volumes, records, recovery.
//! - [`artifact`]: OCI artifacts runtimes cannot pull, fetched with oci-client on an explicit opt-in.

pub mod allowlist;
pub mod artifact;
pub mod auth;
pub mod locks;
pub mod metrics;
pub mod pull;
pub mod pull_records;
pub mod store;
pub mod volumes;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use inlet_proto::runtime::v1::{self as cri, image_service_client::ImageServiceClient};
use sha2::Digest;
use tonic::transport::Channel;

pub use pull::{PullPolicy, PullRequest, Puller, VerificationPolicy};
pub use store::{Containerd, ContainersStorage, ImageStore};
pub use volumes::{ImageVolume, ImageVolumes};

use inlet_host::error::{Error, IoContext, Result};
use inlet_host::mount::MountLayer;

/// The volume attribute naming the image of an ephemeral volume.
pub const IMAGE_ATTRIBUTE: &str = "image";
/// The volume attribute with the pull policy (`Always`, `IfNotPresent`, `Never`).
pub const PULL_POLICY_ATTRIBUTE: &str = "pullPolicy";
/// warm-metal's attribute: `"true"` (any case) means `Always`.
pub const PULL_ALWAYS_ATTRIBUTE: &str = "pullAlways";
/// The volume attribute asking for the image's metadata beside its files (`"true"`).
pub const METADATA_ATTRIBUTE: &str = "metadata";
/// The volume attribute opting in to fetching an OCI artifact without the runtime (`"true"`).
pub const ARTIFACT_ATTRIBUTE: &str = "artifact";

/// Which storage backend to read images from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StorageKind {
    /// containerd's native API on the runtime's socket.
    Containerd,
    /// containers/storage (CRI-O, podman, cri-fake).
    ContainersStorage,
    /// Ask the runtime (CRI `Version`): containerd, else containers/storage.
    Auto,
}

/// How the image engine is set up.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The runtime's CRI socket.
    pub runtime_endpoint: PathBuf,
    /// Which storage backend.
    pub storage: StorageKind,
    /// containers/storage's root; by default the runtime's image filesystem (`ImageFsInfo`).
    pub storage_root: Option<PathBuf>,
    /// containerd's snapshotter (the CRI plugin's, `overlayfs` by default).
    pub snapshotter: String,
    /// Where records and writable layers live.
    pub state_dir: PathBuf,
    /// Which cached images need proof of credentials.
    pub verification: VerificationPolicy,
    /// The images `NeverVerifyAllowlistedImages` hands out without proof.
    pub preloaded_allowlist: allowlist::Allowlist,
    /// Where the node's record of which credentials pulled which image is kept (see
    /// [`pull_records`]: the kubelet's `<root>/image_manager`); pullers of one node share it. None: in
    /// `state_dir`.
    pub pull_records_dir: Option<PathBuf>,
    /// Registries OCI artifacts are fetched from over plain HTTP (artifacts bypass the runtime).
    pub artifact_insecure_registries: Vec<String>,
}

impl EngineConfig {
    /// The defaults for a runtime at `runtime_endpoint`: storage asked of the runtime, containerd's default
    /// snapshotter, upstream's default verification policy, artifacts over HTTPS only.
    pub fn new(runtime_endpoint: &Path, state_dir: &Path) -> Self {
        Self {
            runtime_endpoint: runtime_endpoint.to_path_buf(),
            storage: StorageKind::Auto,
            storage_root: None,
            snapshotter: "overlayfs".into(),
            state_dir: state_dir.to_path_buf(),
            verification: VerificationPolicy::default(),
            preloaded_allowlist: Default::default(),
            pull_records_dir: None,
            artifact_insecure_registries: Vec::new(),
        }
    }
}

/// The engine's parts: a puller and the published volumes, over one store.
pub struct Engine {
    /// The runtime's image service.
    pub cri: ImageServiceClient<Channel>,
    /// Pulls through it.
    pub puller: Arc<Puller>,
    /// What is published.
    pub volumes: Arc<ImageVolumes>,
    /// OCI artifacts, fetched without the runtime.
    pub artifacts: Arc<artifact::Artifacts>,
    /// What is published of them.
    pub artifact_volumes: Arc<ImageVolumes>,
}

impl Engine {
    /// Connects to the runtime, opens the store and the records, and cleans up after a crash.
    pub async fn start(config: &EngineConfig, mounter: Arc<dyn MountLayer>) -> Result<Self> {
        std::fs::create_dir_all(&config.state_dir)
            .context(|| format!("creating {}", config.state_dir.display()))?;
        let channel = inlet_proto::uds::connect(&config.runtime_endpoint)
            .await
            .map_err(|e| {
                Error::Unavailable(format!(
                    "container runtime at {}: {e}",
                    config.runtime_endpoint.display()
                ))
            })?;
        let cri = ImageServiceClient::new(channel.clone());
        let store = open_store(config, channel).await?;
        tracing::info!(storage = store.kind(), "image store ready");
        let puller = Puller::new(
            cri.clone(),
            config
                .pull_records_dir
                .as_ref()
                .unwrap_or(&config.state_dir),
            config.verification,
            Some(Arc::clone(&store)),
        )?
        .with_allowlist(config.preloaded_allowlist.clone());
        // Where inlet kept its earlier record: the state dir, or a records dir given.
        puller.import_legacy(&config.state_dir)?;
        if let Some(dir) = &config.pull_records_dir {
            puller.import_legacy(dir)?;
        }
        match puller.settle_intents().await {
            Ok(settled) => {
                tracing::info!(settled, "pull intents of images the runtime has, recorded")
            }
            Err(e) => tracing::warn!(error = %e, "pull intents left unsettled"),
        }
        let volumes = ImageVolumes::open(store, Arc::clone(&mounter), &config.state_dir)?;
        let published = volumes.recover().await?;
        let artifacts_dir = config.state_dir.join("artifacts");
        let artifacts = Arc::new(artifact::Artifacts::new(
            &artifacts_dir,
            config.artifact_insecure_registries.clone(),
        ));
        let artifact_volumes = ImageVolumes::open(artifacts.clone(), mounter, &artifacts_dir)?;
        let artifacts_published = artifact_volumes.recover().await?;
        tracing::info!(published, artifacts_published, "image volumes recovered");
        Ok(Self {
            cri,
            puller: Arc::new(puller),
            volumes: Arc::new(volumes),
            artifacts,
            artifact_volumes: Arc::new(artifact_volumes),
        })
    }
}

async fn open_store(config: &EngineConfig, channel: Channel) -> Result<Arc<dyn ImageStore>> {
    let runtime = cri::runtime_service_client::RuntimeServiceClient::new(channel.clone());
    let kind = match config.storage {
        StorageKind::Auto => {
            let version = runtime
                .clone()
                .version(cri::VersionRequest::default())
                .await
                .map_err(|s| Error::Unavailable(format!("container runtime: {}", s.message())))?
                .into_inner();
            if version.runtime_name == "containerd" {
                StorageKind::Containerd
            } else {
                StorageKind::ContainersStorage
            }
        }
        other => other,
    };
    Ok(match kind {
        StorageKind::Containerd => {
            // Several instances may share one containerd; each owns what its state dir records.
            let owner = hex::encode(
                &sha2::Sha256::digest(config.state_dir.display().to_string().as_bytes())[..6],
            );
            Arc::new(
                Containerd::connect(&config.runtime_endpoint, &config.snapshotter, &owner).await?,
            )
        }
        _ => {
            let root = match &config.storage_root {
                Some(root) => root.clone(),
                None => image_fs_root(ImageServiceClient::new(channel)).await?,
            };
            Arc::new(ContainersStorage::new(&root, &config.state_dir))
        }
    })
}

/// containers/storage's root from the runtime's image filesystem (`<root>/overlay-images`, as CRI-O
/// reports it).
async fn image_fs_root(mut cri: ImageServiceClient<Channel>) -> Result<PathBuf> {
    let info = cri
        .image_fs_info(cri::ImageFsInfoRequest {})
        .await
        .map_err(|s| Error::Unavailable(format!("container runtime: {}", s.message())))?
        .into_inner();
    let mountpoint = info
        .image_filesystems
        .first()
        .and_then(|fs| fs.fs_id.as_ref())
        .map(|id| PathBuf::from(&id.mountpoint))
        .ok_or_else(|| {
            Error::FailedPrecondition(
                "the runtime reports no image filesystem; pass --storage-root".into(),
            )
        })?;
    Ok(match mountpoint.file_name().and_then(|n| n.to_str()) {
        Some("overlay-images") => mountpoint.parent().unwrap_or(Path::new("/")).to_path_buf(),
        _ => mountpoint,
    })
}

/// What an engine with state in `state_dir` still holds: volume records, shared mounts' dirs, writable
/// layers. Empty once every volume is unpublished (cached images stay: the runtime's image GC owns them).
pub fn leftovers(state_dir: &Path) -> Vec<PathBuf> {
    ["volumes", "images", "rw"]
        .iter()
        .flat_map(|dir| {
            std::fs::read_dir(state_dir.join(dir))
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|e| e.path())
        .collect()
}

/// How long a caller waits for a pull: its gRPC deadline less a margin to answer in, at most `cap`.
pub fn pull_wait(deadline: Option<Duration>, cap: Duration) -> Duration {
    match deadline {
        Some(d) => d.saturating_sub(Duration::from_secs(2)).min(cap),
        None => cap,
    }
}
