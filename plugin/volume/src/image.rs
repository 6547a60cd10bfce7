//! The `kubernetes.io/image` in-tree plugin: a pod's `volumes[].image` (the upstream `ImageVolumeSource`
//! of KEP-4639), pulled and mounted by the kubelet side through the same engine as the `image` CSI driver.
//!
//! Upstream's kubelet hands the image to the runtime in the CRI `Mount.image` field and the runtime mounts
//! it (containerd 2.1+, CRI-O 1.31+). Doing it kubelet-side instead gives every runtime image volumes: the
//! container gets an ordinary read-only host-path mount. As upstream:
//! - the volume is read-only, and `pullPolicy` defaults to `Always` for `:latest`, else `IfNotPresent`;
//! - credentials are the pod's `imagePullSecrets`, read from its namespace;
//! - a cached image pulled with credentials is mounted only for pods that prove access (KEP-2535);
//! - a pull that outlasts the operation's budget goes on; the mount is retried with the volume backoff,
//!   and each retry's event carries the pull's progress.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::ImageVolumeSource;

use crate::{InlineVolume, VolumeSource};

use super::{
    AttachableVolumePlugin, DeviceMountableVolumePlugin, Mounter, MounterArgs, PodInfo, Spec,
    Unmounter, VolumeError, VolumeHost, VolumePlugin,
};
use inlet_image::auth::{self, Credentials};
use inlet_image::pull::PullError;
use inlet_image::{Engine, ImageVolume, PullPolicy, PullRequest};

/// The plugin's name.
pub const PLUGIN_NAME: &str = "kubernetes.io/image";

/// The image plugin. One per node.
pub struct ImagePlugin {
    host: Arc<dyn VolumeHost>,
    engine: Arc<Engine>,
    pull_wait: Duration,
}

impl ImagePlugin {
    /// A plugin over `host`, mounting through `engine`, waiting at most `pull_wait` for a pull per attempt.
    pub fn new(host: Arc<dyn VolumeHost>, engine: Arc<Engine>, pull_wait: Duration) -> Self {
        Self {
            host,
            engine,
            pull_wait,
        }
    }

    fn dir(&self, pod_uid: &str, spec_name: &str) -> PathBuf {
        self.host.pod_volume_dir(pod_uid, PLUGIN_NAME, spec_name)
    }
}

fn source(spec: &Spec) -> Option<&ImageVolumeSource> {
    match spec {
        Spec::Inline { volume, .. } => volume.image(),
        Spec::Persistent { .. } => None,
    }
}

/// Unique to the pod, whichever side mounts: image volumes are never shared through the volume manager
/// (the engine shares the read-only mount underneath; the runtime, its own).
fn unique_name(spec: &Spec, pod: &PodInfo) -> String {
    format!("{PLUGIN_NAME}/{}-{}", pod.uid, spec.name())
}

#[async_trait]
impl VolumePlugin for ImagePlugin {
    fn name(&self) -> &'static str {
        PLUGIN_NAME
    }

    fn can_support(&self, spec: &Spec) -> bool {
        source(spec).is_some()
    }

    async fn unique_volume_name(&self, spec: &Spec, pod: &PodInfo) -> Result<String, VolumeError> {
        Ok(unique_name(spec, pod))
    }

    fn new_mounter(&self, spec: &Spec, pod: &PodInfo) -> Result<Box<dyn Mounter>, VolumeError> {
        let source = source(spec)
            .cloned()
            .ok_or_else(|| VolumeError::final_("not an image volume"))?;
        Ok(Box::new(ImageMounter {
            host: Arc::clone(&self.host),
            engine: Arc::clone(&self.engine),
            pull_wait: self.pull_wait,
            source,
            pod: pod.clone(),
            path: self.dir(&pod.uid, spec.name()),
            volume_id: format!("{}-{}", pod.uid, spec.name()),
            spec_name: spec.name().to_string(),
        }))
    }

    fn new_unmounter(
        &self,
        spec_name: &str,
        pod_uid: &str,
    ) -> Result<Box<dyn Unmounter>, VolumeError> {
        Ok(Box::new(ImageUnmounter {
            engine: Arc::clone(&self.engine),
            path: self.dir(pod_uid, spec_name),
        }))
    }

    /// The reference comes back from the engine's record of the mount.
    fn construct_volume_spec(&self, spec_name: &str, pod_uid: &str) -> Result<Spec, VolumeError> {
        let record = self
            .engine
            .volumes
            .record_on_disk(&self.dir(pod_uid, spec_name))
            .ok_or_else(|| {
                VolumeError::final_(format!("no record of image volume {spec_name:?}"))
            })?;
        Ok(Spec::Inline {
            volume: InlineVolume::new(
                spec_name,
                VolumeSource::Image(ImageVolumeSource {
                    reference: Some(record.image),
                    pull_policy: None,
                }),
            ),
            csi: None,
        })
    }

    async fn requires_remount(&self, _: &Spec, _: &PodInfo) -> bool {
        false
    }

    fn attachable(&self) -> Option<&dyn AttachableVolumePlugin> {
        None
    }

    fn device_mountable(&self) -> Option<&dyn DeviceMountableVolumePlugin> {
        None
    }
}

/// The plugin where the runtime mounts image volumes (upstream's `pkg/volume/image/image.go`): a stub
/// that lets the volume manager track the volume while the kubelet pulls the image before the pod's
/// containers start and hands it to the runtime as a CRI `Mount.image`. Nothing is mounted or made on the
/// host, so there is nothing to tear down or reconstruct; but a volume the kubelet side mounted before
/// the node switched to the runtime's mounts (a restart with `--image-volume-mounts runtime`, or after a
/// runtime upgrade) is still the kubelet side's to reconstruct and tear down.
pub struct RuntimeImagePlugin {
    host: Arc<dyn VolumeHost>,
    kubelet_side: Option<ImagePlugin>,
}

impl RuntimeImagePlugin {
    /// The stub over `host` (for the volume's would-be path), with the kubelet-side plugin, when the node
    /// has one, for what it mounted earlier.
    pub fn new(host: Arc<dyn VolumeHost>, kubelet_side: Option<ImagePlugin>) -> Self {
        Self { host, kubelet_side }
    }

    /// The kubelet-side plugin when it holds a volume at `dir` (from the engine's records in memory).
    fn mounted_kubelet_side(&self, dir: &Path) -> Option<&ImagePlugin> {
        self.kubelet_side
            .as_ref()
            .filter(|plugin| plugin.engine.volumes.at(dir).is_some())
    }
}

#[async_trait]
impl VolumePlugin for RuntimeImagePlugin {
    fn name(&self) -> &'static str {
        PLUGIN_NAME
    }

    fn can_support(&self, spec: &Spec) -> bool {
        source(spec).is_some()
    }

    async fn unique_volume_name(&self, spec: &Spec, pod: &PodInfo) -> Result<String, VolumeError> {
        Ok(unique_name(spec, pod))
    }

    fn new_mounter(&self, spec: &Spec, pod: &PodInfo) -> Result<Box<dyn Mounter>, VolumeError> {
        let path = self.host.pod_volume_dir(&pod.uid, PLUGIN_NAME, spec.name());
        Ok(Box::new(NothingToMount(path)))
    }

    fn new_unmounter(
        &self,
        spec_name: &str,
        pod_uid: &str,
    ) -> Result<Box<dyn Unmounter>, VolumeError> {
        let path = self.host.pod_volume_dir(pod_uid, PLUGIN_NAME, spec_name);
        match self.mounted_kubelet_side(&path) {
            Some(plugin) => plugin.new_unmounter(spec_name, pod_uid),
            None => Ok(Box::new(NothingToMount(path))),
        }
    }

    fn construct_volume_spec(&self, spec_name: &str, pod_uid: &str) -> Result<Spec, VolumeError> {
        let path = self.host.pod_volume_dir(pod_uid, PLUGIN_NAME, spec_name);
        match self.mounted_kubelet_side(&path) {
            Some(plugin) => plugin.construct_volume_spec(spec_name, pod_uid),
            None => Err(VolumeError::final_(format!(
                "image volume {spec_name:?} is the runtime's: nothing to reconstruct"
            ))),
        }
    }

    async fn requires_remount(&self, _: &Spec, _: &PodInfo) -> bool {
        false
    }

    fn attachable(&self) -> Option<&dyn AttachableVolumePlugin> {
        None
    }

    fn device_mountable(&self) -> Option<&dyn DeviceMountableVolumePlugin> {
        None
    }
}

/// The stub's mounter and unmounter: SetUp and TearDown do nothing, as upstream's.
struct NothingToMount(PathBuf);

#[async_trait]
impl Mounter for NothingToMount {
    fn path(&self) -> PathBuf {
        self.0.clone()
    }

    async fn set_up_at(&self, _: &Path, _: &MounterArgs) -> Result<(), VolumeError> {
        Ok(())
    }
}

#[async_trait]
impl Unmounter for NothingToMount {
    fn path(&self) -> PathBuf {
        self.0.clone()
    }

    async fn tear_down_at(&self, _: &Path) -> Result<(), VolumeError> {
        Ok(())
    }
}

/// Pulls and mounts one pod's image volume.
pub struct ImageMounter {
    host: Arc<dyn VolumeHost>,
    engine: Arc<Engine>,
    pull_wait: Duration,
    source: ImageVolumeSource,
    pod: PodInfo,
    path: PathBuf,
    volume_id: String,
    spec_name: String,
}

impl ImageMounter {
    /// The pod's pull secrets that apply to `image`, in keyring order. Missing secrets are skipped, as the
    /// kubelet skips them (`Unable to retrieve some image pull secrets`).
    async fn credentials(&self, image: &str) -> Result<Vec<Credentials>, VolumeError> {
        let mut all = Vec::new();
        for name in &self.pod.image_pull_secrets {
            let secret = match self.host.secret(&self.pod.namespace, name).await {
                Ok(Some(secret)) => secret,
                Ok(None) => {
                    tracing::warn!(namespace = %self.pod.namespace, secret = %name, "image pull secret not found");
                    continue;
                }
                Err(e) => return Err(VolumeError::transient(e)),
            };
            let found = auth::from_secret(&secret).map_err(|e| {
                VolumeError::final_(format!(
                    "image pull secret {}/{name}: {e}",
                    self.pod.namespace
                ))
            })?;
            all.extend(found);
        }
        Ok(auth::for_image(&all, image))
    }
}

#[async_trait]
impl Mounter for ImageMounter {
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    async fn set_up_at(&self, dir: &Path, _: &MounterArgs) -> Result<(), VolumeError> {
        let reference = self
            .source
            .reference
            .as_deref()
            .filter(|r| !r.is_empty())
            .ok_or_else(|| VolumeError::final_("image volume: reference is required"))?;
        let parsed = oci_client::Reference::try_from(reference).map_err(|e| {
            VolumeError::final_(format!(
                "image volume: {reference:?} is not an image reference: {e}"
            ))
        })?;
        let policy = PullPolicy::parse(self.source.pull_policy.as_deref().unwrap_or(""), &parsed)
            .map_err(VolumeError::final_)?;
        let image = parsed.whole();
        let credentials = self.credentials(&image).await?;
        let started = std::time::Instant::now();
        let request = PullRequest {
            image: image.clone(),
            policy,
            credentials,
            wait: self.pull_wait,
            sandbox: None,
        };
        // The kubelet's image events, for the volume's image (`kuberuntime_image.go` words).
        let pulled = match self.engine.puller.ensure(&request).await {
            Ok(pulled) => pulled,
            Err(err @ PullError::InProgress { .. }) => {
                self.host
                    .pod_event(&self.pod, "Normal", "Pulling", &err.to_string());
                return Err(engine_error(err.into()));
            }
            Err(err) => return Err(engine_error(err.into())),
        };
        if pulled.pulled {
            let message = format!(
                "Successfully pulled image {image:?} for volume {:?} in {}",
                self.spec_name,
                humantime::format_duration(Duration::from_millis(
                    started.elapsed().as_millis() as u64
                ))
            );
            self.host.pod_event(&self.pod, "Normal", "Pulled", &message);
        }
        let volume = ImageVolume {
            volume_id: self.volume_id.clone(),
            target: dir.to_path_buf(),
            image,
            image_id: pulled.id,
            writable: false,
            metadata: false,
        };
        self.engine
            .volumes
            .publish(&volume)
            .await
            .map_err(engine_error)
    }
}

/// Unmounts one pod's image volume.
pub struct ImageUnmounter {
    engine: Arc<Engine>,
    path: PathBuf,
}

#[async_trait]
impl Unmounter for ImageUnmounter {
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    async fn tear_down_at(&self, dir: &Path) -> Result<(), VolumeError> {
        self.engine
            .volumes
            .unpublish(dir)
            .await
            .map_err(engine_error)
    }
}

/// The engine's errors in the volume manager's classes: a pull still running or an unreachable runtime is
/// transient (nothing was mounted); everything else is final.
fn engine_error(err: inlet_host::Error) -> VolumeError {
    match err {
        inlet_host::Error::Aborted(m) | inlet_host::Error::Unavailable(m) => {
            VolumeError::transient(m)
        }
        other => VolumeError::final_(other.to_string()),
    }
}
