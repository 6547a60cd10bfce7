//! The `kubernetes.io/secret` plugin (`pkg/volume/secret`): a Secret's keys as files, on a tmpfs (so their
//! values never reach the node's disk), written again when the volume is set up again, as `AtomicWriter`
//! writes them (one version swapped whole for the next). What a real
//! cluster's pods carry for their service account token before projected tokens (Kubernetes 1.20 and
//! older), and what any pod may ask for.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{KeyToPath, Secret, SecretVolumeSource};

use crate::{InlineVolume, VolumeSource};

use super::atomic_writer::{self, FileProjection};
use super::empty_dir::{DirPlugin, DirVolume, set_up_dir, tear_down_dir};
use super::ownership::set_volume_ownership;
use super::{Mounter, MounterArgs, PodInfo, VolumeError, VolumeHost};

/// A file's mode when neither the item nor the volume names one (`SecretVolumeSourceDefaultMode`,
/// `ConfigMapVolumeSourceDefaultMode`).
pub(crate) const DEFAULT_MODE: i32 = 0o644;

/// `secret`.
pub struct SecretVolume;

/// The `kubernetes.io/secret` plugin.
pub type SecretPlugin = DirPlugin<SecretVolume>;

impl DirVolume for SecretVolume {
    const NAME: &'static str = "kubernetes.io/secret";
    /// Secrets change: the files are written again on every pass.
    const REQUIRES_REMOUNT: bool = true;

    fn is(volume: &InlineVolume) -> bool {
        volume.secret().is_some()
    }

    fn reconstructed(name: &str) -> InlineVolume {
        InlineVolume::new(name, VolumeSource::Secret(SecretVolumeSource::default()))
    }

    fn mounter(
        host: Arc<dyn VolumeHost>,
        path: PathBuf,
        volume: &InlineVolume,
        pod: &PodInfo,
    ) -> Box<dyn Mounter> {
        Box::new(SecretMounter {
            host,
            path,
            source: volume.secret().cloned().unwrap_or_default(),
            namespace: pod.namespace.clone(),
        })
    }
}

struct SecretMounter {
    host: Arc<dyn VolumeHost>,
    path: PathBuf,
    source: SecretVolumeSource,
    namespace: String,
}

#[async_trait]
impl Mounter for SecretMounter {
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    async fn set_up_at(&self, dir: &Path, args: &MounterArgs) -> Result<(), VolumeError> {
        let name = self.source.secret_name.clone().unwrap_or_default();
        let optional = self.source.optional.unwrap_or(false);
        let secret = self
            .host
            .secret(&self.namespace, &name)
            .await
            .map_err(VolumeError::transient)?;
        let data = match secret {
            Some(secret) => secret_data(secret),
            None if optional => Default::default(),
            // The secret manager's NotFound (`corev1.Resource("secret")`).
            None => return Err(VolumeError::transient(format!("secret {name:?} not found"))),
        };
        let payload = make_payload(
            data,
            self.source.items.as_deref(),
            self.source.default_mode,
            optional,
            |key| format!("references non-existent secret key: {key}"),
        )?;
        set_up_projected(&self.host, dir, Some(0), payload, args.fs_group).await
    }
}

/// A Secret's keys and values.
pub(crate) fn secret_data(secret: Secret) -> BTreeMap<String, Vec<u8>> {
    secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(key, value)| (key, value.0))
        .collect()
}

/// `MakePayload` (`secret.go`, `configmap.go`): every key as a file of the default mode, or only the items'
/// keys at their paths with their modes. A key an item names that the object lacks is skipped for an
/// optional volume, else `missing(key)`.
pub(crate) fn make_payload(
    data: BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
    optional: bool,
    missing: impl Fn(&str) -> String,
) -> Result<BTreeMap<String, FileProjection>, VolumeError> {
    let default_mode = default_mode.unwrap_or(DEFAULT_MODE);
    let file = |data: Vec<u8>, mode: i32| FileProjection {
        data,
        mode: (mode as u32) & 0o777,
    };
    let Some(items) = items.filter(|i| !i.is_empty()) else {
        return Ok(data
            .into_iter()
            .map(|(key, value)| (key, file(value, default_mode)))
            .collect());
    };
    let mut payload = BTreeMap::new();
    for item in items {
        match data.get(&item.key) {
            Some(value) => {
                let mode = item.mode.unwrap_or(default_mode);
                payload.insert(item.path.clone(), file(value.clone(), mode));
            }
            None if optional => {}
            None => return Err(VolumeError::transient(missing(&item.key))),
        }
    }
    Ok(payload)
}

/// Sets up the directory volume at `dir` (a tmpfs when `memory` is given) and projects `payload` into it.
/// A first set-up that fails is torn down again, as `secret.go` and `configmap.go` SetUpAt do with
/// their `setupSuccess` defer: else a refused payload (an item path with `..`) would leave its tmpfs
/// mounted and its dir behind, unknown to the volume manager, and the pod's teardown could never finish.
/// An update of a volume a container already uses is not torn down on a failure (upstream's is: it would
/// unmount what the running container sees).
pub(crate) async fn set_up_projected(
    host: &Arc<dyn VolumeHost>,
    dir: &Path,
    memory: Option<u64>,
    payload: BTreeMap<String, FileProjection>,
    fs_group: Option<i64>,
) -> Result<(), VolumeError> {
    let first = std::fs::symlink_metadata(dir.join(atomic_writer::DATA_DIR)).is_err();
    let set_up = async {
        set_up_dir(host.as_ref(), dir, memory)?;
        project(host.as_ref(), dir, payload, fs_group).await
    };
    let result = set_up.await;
    if result.is_err() && first {
        if let Err(e) = tear_down_dir(host, dir).await {
            tracing::warn!(dir = %dir.display(), error = %e, "cleaning up a volume whose set-up failed");
        }
    }
    result
}

/// Writes `payload` into the volume at `dir` as `AtomicWriter` does, the whole volume given to the pod's
/// fsGroup (read-only) before the new version becomes visible, on the blocking pool.
pub(crate) async fn project(
    host: &dyn VolumeHost,
    dir: &Path,
    payload: BTreeMap<String, FileProjection>,
    fs_group: Option<i64>,
) -> Result<(), VolumeError> {
    let mounter = host.mounter();
    let dir = dir.to_path_buf();
    let write = move || {
        atomic_writer::write(&dir, &payload, |_| match fs_group {
            Some(gid) => set_volume_ownership(mounter.as_ref(), &dir, gid, true),
            None => Ok(()),
        })
    };
    let written = tokio::task::spawn_blocking(write)
        .await
        .map_err(|e| VolumeError::transient(e.to_string()))?;
    // Retried like any SetUp failure, as upstream retries a bad path with the volume's back-off.
    written
        .map(drop)
        .map_err(|e| VolumeError::transient(e.to_string()))
}
