//! Volumes that are a directory of the pod's own, made by the kubelet: the `kubernetes.io/empty-dir`
//! plugin (`pkg/volume/emptydir`) — on the node's disk, or on a tmpfs for `medium: Memory` — and, through
//! the same [`DirPlugin`], the `kubernetes.io/secret` plugin ([`super::secret`]), which keeps its files on
//! a tmpfs as upstream's does, so secret values never reach the node's disk.

use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::EmptyDirVolumeSource;

use crate::{InlineVolume, VolumeSource};

use super::{
    AttachableVolumePlugin, DeviceMountableVolumePlugin, Mounter, MounterArgs, PodInfo, Spec,
    Unmounter, VolumeError, VolumeHost, VolumePlugin,
};

/// What tells one kind of pod directory volume from another.
pub trait DirVolume: Send + Sync + 'static {
    /// The plugin's name (`kubernetes.io/...`), also the directory under the pod's `volumes/`.
    const NAME: &'static str;
    /// Whether the content must be written again on every pass (upstream's `RequiresRemount`).
    const REQUIRES_REMOUNT: bool;
    /// Whether the pod's volume is of this kind.
    fn is(volume: &InlineVolume) -> bool;
    /// A volume of this kind named `name`, as reconstruction rebuilds it from the directory alone.
    fn reconstructed(name: &str) -> InlineVolume;
    /// The mounter of `volume` at `path`.
    fn mounter(
        host: Arc<dyn VolumeHost>,
        path: PathBuf,
        volume: &InlineVolume,
        pod: &PodInfo,
    ) -> Box<dyn Mounter>;
}

/// The plugin of one kind of pod directory volume.
pub struct DirPlugin<K> {
    host: Arc<dyn VolumeHost>,
    kind: PhantomData<K>,
}

impl<K: DirVolume> DirPlugin<K> {
    /// The plugin over a node's host.
    pub fn new(host: Arc<dyn VolumeHost>) -> Self {
        Self {
            host,
            kind: PhantomData,
        }
    }
}

fn inline(spec: &Spec) -> Option<&InlineVolume> {
    match spec {
        Spec::Inline { volume, .. } => Some(volume),
        Spec::Persistent { .. } => None,
    }
}

#[async_trait]
impl<K: DirVolume> VolumePlugin for DirPlugin<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn can_support(&self, spec: &Spec) -> bool {
        inline(spec).is_some_and(K::is)
    }

    async fn unique_volume_name(&self, spec: &Spec, pod: &PodInfo) -> Result<String, VolumeError> {
        Ok(format!("{}/{}-{}", K::NAME, pod.uid, spec.name()))
    }

    fn new_mounter(&self, spec: &Spec, pod: &PodInfo) -> Result<Box<dyn Mounter>, VolumeError> {
        let volume = inline(spec)
            .filter(|v| K::is(v))
            .ok_or_else(|| VolumeError::final_(format!("not a {} volume", K::NAME)))?;
        let path = self.host.pod_volume_dir(&pod.uid, K::NAME, spec.name());
        Ok(K::mounter(Arc::clone(&self.host), path, volume, pod))
    }

    fn new_unmounter(
        &self,
        spec_name: &str,
        pod_uid: &str,
    ) -> Result<Box<dyn Unmounter>, VolumeError> {
        Ok(Box::new(DirUnmounter {
            host: Arc::clone(&self.host),
            path: self.host.pod_volume_dir(pod_uid, K::NAME, spec_name),
        }))
    }

    fn construct_volume_spec(&self, spec_name: &str, _pod_uid: &str) -> Result<Spec, VolumeError> {
        Ok(Spec::Inline {
            volume: K::reconstructed(spec_name),
            csi: None,
        })
    }

    async fn requires_remount(&self, _spec: &Spec, _pod: &PodInfo) -> bool {
        K::REQUIRES_REMOUNT
    }

    fn attachable(&self) -> Option<&dyn AttachableVolumePlugin> {
        None
    }

    fn device_mountable(&self) -> Option<&dyn DeviceMountableVolumePlugin> {
        None
    }
}

/// `emptyDir`.
pub struct EmptyDir;

/// The `kubernetes.io/empty-dir` plugin.
pub type EmptyDirPlugin = DirPlugin<EmptyDir>;

impl DirVolume for EmptyDir {
    const NAME: &'static str = "kubernetes.io/empty-dir";
    const REQUIRES_REMOUNT: bool = false;

    fn is(volume: &InlineVolume) -> bool {
        volume.empty_dir().is_some()
    }

    fn reconstructed(name: &str) -> InlineVolume {
        InlineVolume::new(
            name,
            VolumeSource::EmptyDir(EmptyDirVolumeSource::default()),
        )
    }

    fn mounter(
        host: Arc<dyn VolumeHost>,
        path: PathBuf,
        volume: &InlineVolume,
        pod: &PodInfo,
    ) -> Box<dyn Mounter> {
        let source = volume.empty_dir();
        let memory = source.and_then(|s| s.medium.as_deref()) == Some("Memory");
        let size_limit = source
            .and_then(|s| s.size_limit.as_ref())
            .and_then(|q| inlet_host::quantity::parse_bytes(&q.0).ok());
        let size = memory.then(|| {
            empty_dir_memory_size(host.node_allocatable().memory, pod.memory_limit, size_limit)
        });
        Box::new(EmptyDirMounter {
            host,
            path,
            memory: size,
        })
    }
}

/// `calculateEmptyDirMemorySize` (`pkg/volume/emptydir/empty_dir.go`, SizeMemoryBackedVolumes, GA in
/// 1.32): a memory-backed emptyDir's tmpfs is the node's allocatable memory, or the pod's memory limit when
/// that is smaller, or the volume's `sizeLimit` when that is smaller still. 0 (the kernel's default) only
/// when none of them is known.
fn empty_dir_memory_size(
    allocatable: Option<u64>,
    pod_limit: Option<u64>,
    size_limit: Option<u64>,
) -> u64 {
    let mut size = allocatable;
    for bound in [pod_limit, size_limit].into_iter().flatten() {
        if bound > 0 && size.is_none_or(|s| bound <= s) {
            size = Some(bound);
        }
    }
    size.unwrap_or(0)
}

struct EmptyDirMounter {
    host: Arc<dyn VolumeHost>,
    path: PathBuf,
    /// On a tmpfs of this size (0: the kernel's default).
    memory: Option<u64>,
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

/// Makes the volume's directory (mode 0777, as upstream: any container user may write), on a tmpfs of the
/// given size when `memory` says one. Idempotent: a directory already set up is left as it is.
pub(crate) fn set_up_dir(
    host: &dyn VolumeHost,
    dir: &Path,
    memory: Option<u64>,
) -> Result<(), VolumeError> {
    let mounter = host.mounter();
    if memory.is_some() && mounter.is_mount_point(dir).unwrap_or(false) {
        return Ok(());
    }
    let relative = dir.strip_prefix(host.root_dir()).map_err(|_| {
        VolumeError::final_(format!("{} is outside the kubelet dir", dir.display()))
    })?;
    inlet_host::host_path::create_dirs(host.root_dir(), relative, 0o750)
        .map_err(|e| VolumeError::transient(format!("mkdir {}: {e}", dir.display())))?;
    if let Some(size) = memory {
        mounter.tmpfs(dir, size).map_err(|e| {
            VolumeError::transient(format!("mount tmpfs on {}: {e}", dir.display()))
        })?;
    }
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .map_err(|e| VolumeError::transient(format!("chmod {}: {e}", dir.display())))
}

/// Tears the directory volume at `dir` down, as its unmounter would.
pub(crate) async fn tear_down_dir(
    host: &Arc<dyn VolumeHost>,
    dir: &Path,
) -> Result<(), VolumeError> {
    DirUnmounter {
        host: Arc::clone(host),
        path: dir.to_path_buf(),
    }
    .tear_down_at(dir)
    .await
}

/// Tears a directory volume down: unmounts its tmpfs if it has one, then removes it and what it holds.
struct DirUnmounter {
    host: Arc<dyn VolumeHost>,
    path: PathBuf,
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
        // Never delete through a mount someone made inside (it would empty what is mounted there).
        if let Some(inner) = mount_below(mounter.as_ref(), dir) {
            return Err(VolumeError::transient(format!(
                "{} is still mounted inside the volume",
                inner.display()
            )));
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

/// A mount point below `dir` (not `dir` itself), if there is one; symlinks are not followed.
fn mount_below(mounter: &dyn inlet_host::mount::MountLayer, dir: &Path) -> Option<PathBuf> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        for entry in std::fs::read_dir(&current).into_iter().flatten().flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let path = entry.path();
            if mounter.is_mount_point(&path).unwrap_or(false) {
                return Some(path);
            }
            stack.push(path);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::empty_dir_memory_size;

    #[test]
    fn a_memory_backed_empty_dir_is_the_smallest_of_node_pod_and_volume() {
        const GI: u64 = 1 << 30;
        assert_eq!(empty_dir_memory_size(Some(8 * GI), None, None), 8 * GI);
        assert_eq!(empty_dir_memory_size(Some(8 * GI), Some(GI), None), GI);
        assert_eq!(
            empty_dir_memory_size(Some(8 * GI), Some(GI), Some(GI / 2)),
            GI / 2
        );
        assert_eq!(
            empty_dir_memory_size(Some(8 * GI), Some(GI), Some(2 * GI)),
            GI,
            "a sizeLimit above the pod's limit is not used"
        );
        assert_eq!(
            empty_dir_memory_size(Some(GI), Some(16 * GI), None),
            GI,
            "nor a pod limit above the node's"
        );
        assert_eq!(empty_dir_memory_size(None, None, None), 0);
    }
}
