//! The `kubernetes.io/empty-dir` plugin (`pkg/volume/emptydir`): a directory that lives as long as the pod,
//! on the node's disk, or on a tmpfs for `medium: Memory`. The `kubernetes.io/secret` plugin keeps its
//! files in one of these on a tmpfs, as upstream's does, so secret values never reach the node's disk.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Volume};

use super::{
    AttachableVolumePlugin, DeviceMountableVolumePlugin, Mounter, MounterArgs, PodInfo, Spec,
    Unmounter, VolumeError, VolumeHost, VolumePlugin,
};

/// The plugin's name.
pub const PLUGIN_NAME: &str = "kubernetes.io/empty-dir";

/// The `emptyDir` volume plugin.
pub struct EmptyDirPlugin {
    host: Arc<dyn VolumeHost>,
}

impl EmptyDirPlugin {
    /// The plugin over a node's host.
    pub fn new(host: Arc<dyn VolumeHost>) -> Self {
        Self { host }
    }
}

fn source(spec: &Spec) -> Option<&EmptyDirVolumeSource> {
    match spec {
        Spec::Inline { volume, .. } => volume.empty_dir.as_ref(),
        Spec::Persistent { .. } => None,
    }
}

#[async_trait]
impl VolumePlugin for EmptyDirPlugin {
    fn name(&self) -> &'static str {
        PLUGIN_NAME
    }

    fn can_support(&self, spec: &Spec) -> bool {
        source(spec).is_some()
    }

    async fn unique_volume_name(&self, spec: &Spec, pod: &PodInfo) -> Result<String, VolumeError> {
        Ok(format!("{PLUGIN_NAME}/{}-{}", pod.uid, spec.name()))
    }

    fn new_mounter(&self, spec: &Spec, pod: &PodInfo) -> Result<Box<dyn Mounter>, VolumeError> {
        let memory = source(spec).and_then(|s| s.medium.as_deref()) == Some("Memory");
        Ok(Box::new(EmptyDirMounter {
            host: Arc::clone(&self.host),
            path: self.host.pod_volume_dir(&pod.uid, PLUGIN_NAME, spec.name()),
            memory,
        }))
    }

    fn new_unmounter(
        &self,
        spec_name: &str,
        pod_uid: &str,
    ) -> Result<Box<dyn Unmounter>, VolumeError> {
        Ok(Box::new(DirUnmounter {
            host: Arc::clone(&self.host),
            path: self.host.pod_volume_dir(pod_uid, PLUGIN_NAME, spec_name),
        }))
    }

    fn construct_volume_spec(&self, spec_name: &str, _pod_uid: &str) -> Result<Spec, VolumeError> {
        Ok(Spec::Inline {
            volume: Box::new(Volume {
                name: spec_name.to_string(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            }),
            csi: None,
        })
    }

    async fn requires_remount(&self, _spec: &Spec, _pod: &PodInfo) -> bool {
        false
    }

    fn attachable(&self) -> Option<&dyn AttachableVolumePlugin> {
        None
    }

    fn device_mountable(&self) -> Option<&dyn DeviceMountableVolumePlugin> {
        None
    }
}

struct EmptyDirMounter {
    host: Arc<dyn VolumeHost>,
    path: PathBuf,
    memory: bool,
}

#[async_trait]
impl Mounter for EmptyDirMounter {
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    async fn set_up_at(&self, dir: &Path, _args: &MounterArgs) -> Result<(), VolumeError> {
        set_up_dir(self.host.as_ref(), dir, self.memory)
    }
}

/// Makes the volume's directory (mode 0777, as upstream: any container user may write), on a tmpfs when
/// `memory`. Idempotent: a directory already set up is left as it is.
pub(crate) fn set_up_dir(
    host: &dyn VolumeHost,
    dir: &Path,
    memory: bool,
) -> Result<(), VolumeError> {
    let mounter = host.mounter();
    if memory && mounter.is_mount_point(dir).unwrap_or(false) {
        return Ok(());
    }
    let relative = dir.strip_prefix(host.root_dir()).map_err(|_| {
        VolumeError::final_(format!("{} is outside the kubelet dir", dir.display()))
    })?;
    crate::host_path::create_dirs(host.root_dir(), relative, 0o750)
        .map_err(|e| VolumeError::transient(format!("mkdir {}: {e}", dir.display())))?;
    if memory {
        mounter.tmpfs(dir, 0).map_err(|e| {
            VolumeError::transient(format!("mount tmpfs on {}: {e}", dir.display()))
        })?;
    }
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .map_err(|e| VolumeError::transient(format!("chmod {}: {e}", dir.display())))
}

/// Tears a directory volume down: unmounts its tmpfs if it has one, then removes it and what it holds.
pub(crate) struct DirUnmounter {
    pub(crate) host: Arc<dyn VolumeHost>,
    pub(crate) path: PathBuf,
}

#[async_trait]
impl Unmounter for DirUnmounter {
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    async fn tear_down_at(&self, dir: &Path) -> Result<(), VolumeError> {
        let mounter = self.host.mounter();
        if mounter.is_mount_point(dir).unwrap_or(false) {
            mounter
                .unmount(dir)
                .map_err(|e| VolumeError::transient(format!("unmount {}: {e}", dir.display())))?;
        }
        match std::fs::remove_dir_all(dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(VolumeError::transient(format!(
                "remove {}: {e}",
                dir.display()
            ))),
        }
    }
}
