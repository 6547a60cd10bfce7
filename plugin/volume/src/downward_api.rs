//! The `kubernetes.io/downward-api` plugin (`pkg/volume/downwardapi`): the pod's own fields (name,
//! namespace, uid, labels, annotations) and its containers' resources as files, on a tmpfs, written as
//! `AtomicWriter` writes them and again on every pass, so a change of labels or annotations reaches the
//! files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, DownwardAPIVolumeSource};

use crate::{InlineVolume, VolumeSource};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::atomic_writer::FileProjection;
use super::empty_dir::{DirPlugin, DirVolume};
use super::fieldpath::{container_resource_value, extract_field_path_as_string};
use super::secret::{DEFAULT_MODE, set_up_projected};
use super::{Mounter, MounterArgs, PodInfo, VolumeError, VolumeHost, aggregate};

/// `downwardAPI`.
pub struct DownwardApiVolume;

/// The `kubernetes.io/downward-api` plugin.
pub type DownwardApiPlugin = DirPlugin<DownwardApiVolume>;

impl DirVolume for DownwardApiVolume {
    const NAME: &'static str = "kubernetes.io/downward-api";
    /// Labels and annotations change: the files are written again on every pass.
    const REQUIRES_REMOUNT: bool = true;

    fn is(volume: &InlineVolume) -> bool {
        volume.downward_api().is_some()
    }

    fn reconstructed(name: &str) -> InlineVolume {
        InlineVolume::new(
            name,
            VolumeSource::DownwardApi(DownwardAPIVolumeSource::default()),
        )
    }

    fn mounter(
        host: Arc<dyn VolumeHost>,
        path: PathBuf,
        volume: &InlineVolume,
        pod: &PodInfo,
    ) -> Box<dyn Mounter> {
        Box::new(DownwardApiMounter {
            host,
            path,
            source: volume.downward_api().cloned().unwrap_or_default(),
            pod: pod.clone(),
        })
    }
}

struct DownwardApiMounter {
    host: Arc<dyn VolumeHost>,
    path: PathBuf,
    source: DownwardAPIVolumeSource,
    pod: PodInfo,
}

#[async_trait]
impl Mounter for DownwardApiMounter {
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    async fn set_up_at(&self, dir: &Path, args: &MounterArgs) -> Result<(), VolumeError> {
        let items = self.source.items.as_deref().unwrap_or_default();
        let payload = collect_data(
            items,
            &self.pod,
            self.host.as_ref(),
            self.source.default_mode,
        )?;
        set_up_projected(&self.host, dir, Some(0), payload, args.fs_group).await
    }
}

/// `downwardapi.CollectData`: each item's value at its (cleaned) path with its mode, or the volume's;
/// every item that cannot be read is an error, all of them reported together.
pub(crate) fn collect_data(
    items: &[DownwardAPIVolumeFile],
    pod: &PodInfo,
    host: &dyn VolumeHost,
    default_mode: Option<i32>,
) -> Result<BTreeMap<String, FileProjection>, VolumeError> {
    let meta = ObjectMeta {
        name: Some(pod.name.clone()),
        namespace: Some(pod.namespace.clone()),
        uid: Some(pod.uid.clone()),
        labels: Some(pod.labels.clone()),
        annotations: Some(pod.annotations.clone()),
        ..Default::default()
    };
    let mut errors = Vec::new();
    let mut data = BTreeMap::new();
    for item in items {
        let mode = item.mode.or(default_mode).unwrap_or(DEFAULT_MODE);
        let value = if let Some(field) = &item.field_ref {
            extract_field_path_as_string(&meta, &field.field_path)
        } else if let Some(resource) = &item.resource_field_ref {
            let container = resource.container_name.as_deref().unwrap_or_default();
            container_resource_value(
                resource,
                &pod.containers,
                container,
                &host.node_allocatable(),
            )
        } else {
            Ok(String::new())
        };
        let value = value.unwrap_or_else(|e| {
            errors.push(e);
            String::new()
        });
        data.insert(
            clean_path(&item.path),
            FileProjection {
                data: value.into_bytes(),
                mode: (mode as u32) & 0o777,
            },
        );
    }
    match errors.is_empty() {
        true => Ok(data),
        false => Err(VolumeError::transient(aggregate(&errors))),
    }
}

/// `filepath.Clean` of a relative path: `a//b/./c` is `a/b/c`, `a/../b` is `b`. A path that still climbs
/// (`../b`) is refused where the writer checks every path.
fn clean_path(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
        match (part, parts.last()) {
            ("..", Some(last)) if *last != ".." => drop(parts.pop()),
            _ => parts.push(part),
        }
    }
    match parts.is_empty() {
        true => ".".into(),
        false => parts.join("/"),
    }
}
