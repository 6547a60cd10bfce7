//! The kubelet's pod directories (`kubelet_volumes.go`): a pod's directory goes once the volume manager
//! holds none of its volumes and nothing under it is mounted, never through a mount; the log dirs of pods
//! that are gone go too (`kuberuntime_gc.go`).

use super::Kubelet;

impl Kubelet {
    /// Removes the directories of pods that are gone, once the reconciler has torn their volumes down.
    pub(super) fn clean_orphaned_pod_dirs(&self) {
        let pods_dir = self.config.root.join("pods");
        let Ok(entries) = std::fs::read_dir(&pods_dir) else {
            return;
        };
        // A pod with volumes keeps its dir whatever the API says: the API's pods are listed only once a
        // dir without volumes is found, which a settled node, every 2 s, does not have.
        let mut pods = None;
        for entry in entries.flatten() {
            let uid = entry.file_name().to_string_lossy().into_owned();
            if self.volumes.pod_volumes_exist(&uid) {
                continue;
            }
            let pods = pods.get_or_insert_with(|| self.my_pods());
            if pods.iter().any(|p| p.metadata.uid.as_deref() == Some(&uid)) {
                continue;
            }
            let dir = entry.path();
            if self.volumes.mounter().anything_mounted_under(&dir) {
                continue;
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// A pod's container log dir, `<root>/logs/<namespace>_<name>_<uid>` (upstream's
    /// `/var/log/pods/<namespace>_<name>_<uid>`, `BuildPodLogsDirectory`).
    pub(super) fn pod_log_dir(&self, pod: &k8s_openapi::api::core::v1::Pod) -> std::path::PathBuf {
        let meta = &pod.metadata;
        self.config.root.join("logs").join(format!(
            "{}_{}_{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
            meta.uid.as_deref().unwrap_or_default()
        ))
    }

    /// `evictPodLogsDirectories` (`kuberuntime_gc.go`): the log dirs ([`Self::pod_log_dir`]) of
    /// pods that are gone, such as one force-deleted while this kubelet was down, whose pod worker never
    /// ran to remove them.
    pub(super) fn evict_pod_logs_dirs(&self) {
        let Ok(entries) = std::fs::read_dir(self.config.root.join("logs")) else {
            return;
        };
        let pods = self.my_pods();
        let live: foldhash::HashSet<&str> = pods
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some((_, uid)) = name.rsplit_once('_') else {
                continue;
            };
            if live.contains(uid) || self.pods.lock().contains_key(uid) {
                continue;
            }
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
