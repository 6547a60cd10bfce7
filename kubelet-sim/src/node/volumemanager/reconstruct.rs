//! Reconstruction after a kubelet restart (`reconstruct.go`): what was mounted is read back from disk
//! (`vol_data.json` beside each pod volume and staging dir, the image engine's records) into the actual
//! state as *uncertain*, so the reconciler publishes again what pods still want (idempotently) and tears
//! down what belonged to pods deleted while the kubelet was down, once the populator has added the API's
//! pods (until then nothing is torn down: `readyToUnmount`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use inlet_volume::PodInfo;
use inlet_volume::csi::vol_data::{FILE_NAME, VolData};

use super::VolumeManager;
use super::actual_state::{MountState, MountedPod};
use crate::api::ApiPod;

const CSI_DIR: &str = "kubernetes.io~csi";

impl VolumeManager {
    /// Rebuilds the actual state from disk, for this node's `pods` by UID. Run once at start, before the
    /// first pass.
    pub fn reconstruct(&self, pods: &HashMap<String, Arc<ApiPod>>) {
        // The CSI plugin is first; its volumes are found by their vol data.
        let plugin = Arc::clone(&self.plugins[0]);
        for (uid, spec_name, dir) in volume_dirs(&self.root.join("pods")) {
            let Ok(data) = VolData::load(&dir) else {
                continue;
            };
            let Ok(spec) = plugin.construct_volume_spec(&spec_name, &uid) else {
                continue;
            };
            let unique = unique_name(&data, &uid);
            self.adopt(pods, &unique, &spec, &uid, spec_name, dir.join("mount"));
        }
        self.reconstruct_pod_dir_volumes(pods);
        for (data, path) in staging_dirs(&self.root.join("plugins").join(plugin.name())) {
            let unique = unique_name(&data, "");
            {
                let spec = inlet_volume::csi::spec_from_vol_data(&data);
                let mut asw = self.asw.lock();
                asw.mark_attached(&unique, &spec);
                asw.set_device(&unique, Some((path, MountState::Uncertain)));
            }
        }
        // Everything found is for the reconciler to look at.
        let found: Vec<String> = self.asw.lock().volumes().keys().cloned().collect();
        self.review_all(found);
        self.reconstructed.store(true, Ordering::Release);
    }

    /// The other plugins' volumes left by the previous kubelet (image volumes, from the engine's record of
    /// the mount; secret, configMap, downwardAPI, projected and emptyDir dirs, which may hold a tmpfs): each
    /// plugin rebuilds the spec from its dir's name, as `reconstructVolume` asks every plugin found under
    /// a pod's `volumes/`.
    fn reconstruct_pod_dir_volumes(&self, pods: &HashMap<String, Arc<ApiPod>>) {
        for plugin in self.plugins.iter().skip(1) {
            let name = plugin.name();
            let dirs = plugin_volume_dirs(&self.root.join("pods"), &name.replace('/', "~"));
            for (uid, spec_name, dir) in dirs {
                let Ok(spec) = plugin.construct_volume_spec(&spec_name, &uid) else {
                    continue;
                };
                let unique = format!("{name}/{uid}-{spec_name}");
                self.adopt(pods, &unique, &spec, &uid, spec_name, dir);
            }
        }
    }

    /// Records a volume found on disk as possibly mounted for its pod (the pod may be gone: then only its
    /// UID is known, which is all the unmounter needs).
    fn adopt(
        &self,
        pods: &HashMap<String, Arc<ApiPod>>,
        unique: &str,
        spec: &inlet_volume::Spec,
        uid: &str,
        spec_name: String,
        path: PathBuf,
    ) {
        let pod = pods
            .get(uid)
            .map(|p| PodInfo::from_pod(p))
            .unwrap_or_else(|| PodInfo {
                uid: uid.to_string(),
                ..Default::default()
            });
        let mut asw = self.asw.lock();
        asw.mark_attached(unique, spec);
        asw.set_pod(
            unique,
            MountedPod {
                pod: Arc::new(pod),
                outer_name: spec_name.clone(),
                spec_name,
                path,
                state: MountState::Uncertain,
                published_at: Instant::now(),
                reconstructed: true,
            },
        );
    }
}

/// The unique name a reconstructed volume had (see `CsiPlugin::unique_volume_name`).
fn unique_name(data: &VolData, pod_uid: &str) -> String {
    match data.lifecycle_mode.as_str() {
        "Ephemeral" => format!("kubernetes.io/csi/{pod_uid}-{}", data.spec_vol_id),
        _ => format!(
            "kubernetes.io/csi/{}^{}",
            data.driver_name, data.volume_handle
        ),
    }
}

/// `(pod uid, spec name, volume dir)` for every CSI volume dir under `pods/` (one with its vol data).
fn volume_dirs(pods: &Path) -> Vec<(String, String, PathBuf)> {
    let mut found = plugin_volume_dirs(pods, CSI_DIR);
    found.retain(|(_, _, dir)| dir.join(FILE_NAME).exists());
    found
}

/// `(pod uid, spec name, volume dir)` for every dir under `pods/*/volumes/<plugin_dir>/`.
fn plugin_volume_dirs(pods: &Path, plugin_dir: &str) -> Vec<(String, String, PathBuf)> {
    let mut found = Vec::new();
    for pod in std::fs::read_dir(pods).into_iter().flatten().flatten() {
        let uid = pod.file_name().to_string_lossy().into_owned();
        for volume in std::fs::read_dir(pod.path().join("volumes").join(plugin_dir))
            .into_iter()
            .flatten()
            .flatten()
        {
            found.push((
                uid.clone(),
                volume.file_name().to_string_lossy().into_owned(),
                volume.path(),
            ));
        }
    }
    found
}

/// `(vol data, globalmount path)` for every staging dir under `plugins/kubernetes.io/csi/<driver>/<hash>/`.
fn staging_dirs(plugin_dir: &Path) -> Vec<(VolData, PathBuf)> {
    let mut found = Vec::new();
    for driver in std::fs::read_dir(plugin_dir)
        .into_iter()
        .flatten()
        .flatten()
    {
        for volume in std::fs::read_dir(driver.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Ok(data) = VolData::load(&volume.path()) {
                found.push((data, volume.path().join("globalmount")));
            }
        }
    }
    found
}
