//! Reconstruction after a kubelet restart (`reconstruct.go`, `kubelet_volumes.go`): what was mounted is
//! read back from disk (`vol_data.json` beside each pod volume and staging dir) into the actual state as
//! *uncertain*, so the reconciler publishes again what pods still want (idempotently) and tears down what
//! belonged to pods deleted while the kubelet was down, once the populator has added the API's pods (until
//! then nothing is torn down: `readyToUnmount` in upstream's `reconstruct.go`). Sandboxes the runtime still runs are adopted, or
//! stopped when their pod is gone. Orphaned pod directories are removed once nothing under them is mounted.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use inlet_proto::runtime::v1 as cri;
use inlet_volume::PodInfo;
use inlet_volume::csi::vol_data::{FILE_NAME, VolData};
use inlet_volume::image::PLUGIN_NAME as IMAGE_PLUGIN;
use k8s_openapi::api::core::v1::Pod;

use super::actual_state::{MountState, MountedPod};
use super::pod_worker::{ContainerReport, MountReport, PodState};
use super::{Kubelet, PodRuntime};

const CSI_DIR: &str = "kubernetes.io~csi";
const IMAGE_DIR: &str = "kubernetes.io~image";

impl Kubelet {
    /// Rebuilds the actual state and the pod workers' view from disk and the runtime. Run once at start.
    pub(super) async fn reconstruct(&self) {
        let pods = self.my_pods_by_uid();
        let plugin = std::sync::Arc::clone(&self.plugins[0]);
        for (uid, spec_name, dir) in volume_dirs(&self.config.root.join("pods")) {
            let Ok(data) = VolData::load(&dir) else {
                continue;
            };
            let Ok(spec) = plugin.construct_volume_spec(&spec_name, &uid) else {
                continue;
            };
            let unique = unique_name(&data, &uid);
            self.adopt(&pods, &unique, &spec, &uid, spec_name, dir.join("mount"));
        }
        self.reconstruct_image_volumes(&pods);
        for (data, path) in staging_dirs(&self.config.root.join("plugins").join(plugin.name())) {
            let unique = unique_name(&data, "");
            {
                let spec = inlet_volume::csi::spec_from_vol_data(&data);
                let mut asw = self.asw.lock();
                asw.mark_attached(&unique, &spec);
                asw.set_device(&unique, Some((path, MountState::Uncertain)));
            }
        }
    }

    /// This node's pods by UID.
    fn my_pods_by_uid(&self) -> HashMap<String, std::sync::Arc<Pod>> {
        self.my_pods()
            .into_iter()
            .filter_map(|p| Some((p.metadata.uid.clone()?, p)))
            .collect()
    }

    /// Sandboxes the runtime still has: a pod that still exists keeps running; an orphan is stopped. Run
    /// once the populator has added the API's pods, so a pod not loaded yet is not taken for an orphan.
    pub(super) async fn adopt_sandboxes(&self) {
        let pods = self.my_pods_by_uid();
        let mut runtime = self.cri.runtime.clone();
        let Ok(sandboxes) = runtime
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await
        else {
            return;
        };
        for sandbox in sandboxes.into_inner().items {
            let uid = sandbox
                .labels
                .get("io.kubernetes.pod.uid")
                .cloned()
                .unwrap_or_default();
            let node_pod = pods.contains_key(&uid);
            let ours = node_pod || self.config.root.join("pods").join(&uid).exists();
            if !ours {
                continue;
            }
            if !node_pod {
                let _ = runtime
                    .stop_pod_sandbox(cri::StopPodSandboxRequest {
                        pod_sandbox_id: sandbox.id.clone(),
                    })
                    .await;
                let _ = runtime
                    .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                        pod_sandbox_id: sandbox.id.clone(),
                    })
                    .await;
                continue;
            }
            let filter = cri::ContainerFilter {
                pod_sandbox_id: sandbox.id.clone(),
                ..Default::default()
            };
            let containers = runtime
                .list_containers(cri::ListContainersRequest {
                    filter: Some(filter),
                })
                .await
                .map(|r| r.into_inner().containers)
                .unwrap_or_default();
            let mut reports = Vec::new();
            for c in containers {
                let status = runtime
                    .container_status(cri::ContainerStatusRequest {
                        container_id: c.id.clone(),
                        verbose: false,
                    })
                    .await;
                let mounts = status
                    .ok()
                    .and_then(|s| s.into_inner().status)
                    .map(|s| s.mounts)
                    .unwrap_or_default();
                // Running as far as is known: the next relist sees whether it exited meanwhile.
                let metadata = c.metadata.unwrap_or_default();
                reports.push(ContainerReport {
                    name: metadata.name,
                    restart_count: metadata.attempt,
                    state: "running".into(),
                    id: c.id,
                    mounts: mounts
                        .into_iter()
                        .map(|m| MountReport {
                            container_path: m.container_path,
                            host_path: m.host_path,
                            readonly: m.readonly,
                        })
                        .collect(),
                    ..Default::default()
                });
            }
            let runtime_state = PodRuntime {
                state: PodState::Running,
                sandbox_id: Some(sandbox.id),
                containers: reports,
                seen_at: Some(Instant::now()),
                ..Default::default()
            };
            self.pods.lock().insert(uid, runtime_state);
        }
    }

    /// Removes the directories of pods that are gone, once the reconciler has torn their volumes down.
    pub(super) fn clean_orphaned_pod_dirs(&self) {
        let pods_dir = self.config.root.join("pods");
        let Ok(entries) = std::fs::read_dir(&pods_dir) else {
            return;
        };
        let pods = self.my_pods();
        let live: std::collections::HashSet<&str> = pods
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        for entry in entries.flatten() {
            let uid = entry.file_name().to_string_lossy().into_owned();
            if live.contains(uid.as_str())
                || self.asw.lock().pod_has_mounts(&uid)
                || self.dsw.lock().has_pod(&uid)
            {
                continue;
            }
            let dir = entry.path();
            let mounter = self.host.mounter.clone();
            if super::pod_worker::walk_dirs(&dir)
                .iter()
                .any(|d| mounter.is_mount_point(d).unwrap_or(true))
            {
                continue;
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

impl Kubelet {
    /// Image volumes left mounted by the previous kubelet: the image plugin rebuilds each spec from the
    /// engine's record of the mount.
    fn reconstruct_image_volumes(&self, pods: &HashMap<String, std::sync::Arc<Pod>>) {
        let Some(plugin) = self.plugins.iter().find(|p| p.name() == IMAGE_PLUGIN) else {
            return;
        };
        for (uid, spec_name, dir) in plugin_volume_dirs(&self.config.root.join("pods"), IMAGE_DIR) {
            let Ok(spec) = plugin.construct_volume_spec(&spec_name, &uid) else {
                continue;
            };
            let unique = format!("{IMAGE_PLUGIN}/{uid}-{spec_name}");
            self.adopt(pods, &unique, &spec, &uid, spec_name, dir);
        }
    }

    /// Records a volume found on disk as possibly mounted for its pod (the pod may be gone: then only its
    /// UID is known, which is all the unmounter needs).
    fn adopt(
        &self,
        pods: &HashMap<String, std::sync::Arc<Pod>>,
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
                pod,
                outer_name: spec_name.clone(),
                spec_name,
                path,
                state: MountState::Uncertain,
                published_at: Instant::now(),
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
