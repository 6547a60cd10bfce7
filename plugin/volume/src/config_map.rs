//! The `kubernetes.io/configmap` plugin (`pkg/volume/configmap`): a ConfigMap's keys (`data` and
//! `binaryData`) as files in a directory on the node's disk, written as `AtomicWriter` writes them, so a
//! program watching `..data` sees each update whole.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ConfigMap, ConfigMapVolumeSource};

use crate::{InlineVolume, VolumeSource};

use super::empty_dir::{DirPlugin, DirVolume};
use super::secret::{make_payload, set_up_projected};
use super::{Mounter, MounterArgs, PodInfo, VolumeError, VolumeHost};

/// `configMap`.
pub struct ConfigMapVolume;

/// The `kubernetes.io/configmap` plugin.
pub type ConfigMapPlugin = DirPlugin<ConfigMapVolume>;

impl DirVolume for ConfigMapVolume {
    const NAME: &'static str = "kubernetes.io/configmap";
    /// ConfigMaps change: the files are written again on every pass.
    const REQUIRES_REMOUNT: bool = true;

    fn is(volume: &InlineVolume) -> bool {
        volume.config_map().is_some()
    }

    fn reconstructed(name: &str) -> InlineVolume {
        InlineVolume::new(
            name,
            VolumeSource::ConfigMap(ConfigMapVolumeSource::default()),
        )
    }

    fn mounter(
        host: Arc<dyn VolumeHost>,
        path: PathBuf,
        volume: &InlineVolume,
        pod: &PodInfo,
    ) -> Box<dyn Mounter> {
        Box::new(ConfigMapMounter {
            host,
            path,
            source: volume.config_map().cloned().unwrap_or_default(),
            namespace: pod.namespace.clone(),
        })
    }
}

struct ConfigMapMounter {
    host: Arc<dyn VolumeHost>,
    path: PathBuf,
    source: ConfigMapVolumeSource,
    namespace: String,
}

#[async_trait]
impl Mounter for ConfigMapMounter {
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    async fn set_up_at(&self, dir: &Path, args: &MounterArgs) -> Result<(), VolumeError> {
        let name = self.source.name.clone();
        let optional = self.source.optional.unwrap_or(false);
        let config_map = self
            .host
            .config_map(&self.namespace, &name)
            .await
            .map_err(VolumeError::transient)?;
        let data = match config_map {
            Some(cm) => config_map_data(cm),
            None if optional => Default::default(),
            // The configmap manager's NotFound (`corev1.Resource("configmap")`).
            None => {
                return Err(VolumeError::transient(format!(
                    "configmap {name:?} not found"
                )));
            }
        };
        let payload = make_payload(
            data,
            self.source.items.as_deref(),
            self.source.default_mode,
            optional,
            |key| format!("configmap references non-existent config key: {key}"),
        )?;
        set_up_projected(&self.host, dir, None, payload, args.fs_group).await
    }
}

/// A ConfigMap's keys and values, `binaryData` after `data` (the API server refuses a key in both).
pub(crate) fn config_map_data(config_map: ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let text = config_map.data.unwrap_or_default();
    let binary = config_map.binary_data.unwrap_or_default();
    text.into_iter()
        .map(|(key, value)| (key, value.into_bytes()))
        .chain(binary.into_iter().map(|(key, value)| (key, value.0)))
        .collect()
}
