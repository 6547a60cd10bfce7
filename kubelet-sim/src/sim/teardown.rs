//! Teardown: every pod of the run deleted, then the wait until they, their volumes and their attachments
//! are gone, and the scan of each node's root for what is left (mounts, pod dirs, image state).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::storage::v1::VolumeAttachment;

use super::Simulation;
use crate::api::ApiPod;
use crate::node::Kubelet;
use crate::report::TeardownReport;

impl Simulation {
    /// Deletes every pod and waits until they, their volumes and their attachments are gone; then looks
    /// for anything left under the root.
    pub async fn teardown(&self, timeout: Duration) -> TeardownReport {
        let started = Instant::now();
        let cluster = self
            .config
            .cluster
            .clone()
            .map(crate::cluster::Cluster::new);
        // The keys only: a pod this loop still held would be copied by its own delete (the store changes
        // a pod in place only when no one else holds it), 10,000 copies at once.
        let deleted: Vec<(String, String, String)> = self
            .run_pods()
            .iter()
            .map(|pod| {
                let meta = &pod.metadata;
                (
                    meta.namespace.clone().unwrap_or_default(),
                    meta.name.clone().unwrap_or_default(),
                    meta.uid.clone().unwrap_or_default(),
                )
            })
            .collect();
        for (namespace, name, _) in &deleted {
            let (namespace, name) = (namespace.as_str(), name.as_str());
            match &cluster {
                // Through the API server: the deletion comes back by the watch, as any other would.
                Some(cluster) => {
                    if let Err(e) = cluster.delete_pod(namespace, name).await {
                        tracing::warn!(pod = name, "deleting: {e}");
                    }
                }
                None => drop(self.delete_pod(namespace, name)),
            }
        }
        let gone = || {
            let deleted_gone = deleted.iter().all(|(namespace, name, uid)| {
                self.api
                    .peek::<ApiPod>(namespace, name)
                    .is_none_or(|p| p.metadata.uid.as_deref() != Some(uid))
            });
            // A pod leaves only once its volumes are torn down; when no other pod remains, the nodes
            // must also be idle (unstaged, detached) and have removed the pod directories a previous
            // kubelet left (their orphan cleanup runs in the pass after the last teardown).
            let no_pod_dirs = |n: &Kubelet| {
                std::fs::read_dir(n.config.root.join("pods"))
                    .map_or(true, |mut entries| entries.next().is_none())
            };
            deleted_gone
                && (!self.api.list::<ApiPod>().is_empty()
                    || (self.api.list::<VolumeAttachment>().is_empty()
                        && self.nodes.iter().all(|n| n.idle() && no_pod_dirs(n))))
        };
        let mut complete = self.wait_for(timeout, |_| gone()).await;
        // In a cluster, the pods' objects go with their nodes' final deletes.
        if let Some(cluster) = &cluster {
            while complete && !cluster.pods_gone(&deleted).await {
                complete = started.elapsed() < timeout;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let left: Vec<String> = deleted
            .iter()
            .filter(|(namespace, name, uid)| {
                self.api
                    .peek::<ApiPod>(namespace, name)
                    .is_some_and(|p| p.metadata.uid.as_deref() == Some(uid))
            })
            .map(|(namespace, name, _)| format!("{namespace}/{name}"))
            .collect();
        let mut report = self.leftovers(complete).await;
        report.leftover_pods = left;
        report
    }

    /// What is left under the nodes' roots after a teardown that did (or did not) `complete`. The scan
    /// reads directories and the mount table, so it runs on the blocking pool.
    async fn leftovers(&self, complete: bool) -> TeardownReport {
        let nodes: Vec<(PathBuf, Vec<PathBuf>)> = self
            .nodes
            .iter()
            .map(|node| {
                let mut image_dirs = vec![crate::node::image_plugin_dir(&node.config.root)];
                image_dirs.extend(
                    self.drivers
                        .iter()
                        .filter(|d| d.node == node.config.name)
                        .filter_map(|d| d.image_state.clone()),
                );
                (node.config.root.clone(), image_dirs)
            })
            .collect();
        let mounter = Arc::clone(&self.config.mounter);
        let leftover_attachments = self
            .api
            .list::<VolumeAttachment>()
            .into_iter()
            .filter_map(|v| v.metadata.name.clone())
            .collect();
        let scan = move || {
            let shown = |p: &Path| p.display().to_string();
            let mut report = TeardownReport {
                complete,
                leftover_attachments,
                ..Default::default()
            };
            for (root, image_dirs) in &nodes {
                let pods = std::fs::read_dir(root.join("pods")).into_iter().flatten();
                report
                    .leftover_pod_dirs
                    .extend(pods.flatten().map(|e| shown(&e.path())));
                let logs = std::fs::read_dir(root.join("logs")).into_iter().flatten();
                report
                    .leftover_log_dirs
                    .extend(logs.flatten().map(|e| shown(&e.path())));
                // A running local driver's own mount of its content dir is not a leftover.
                let mounts = mounter.mounts_under(root).unwrap_or_default();
                report.leftover_mounts.extend(
                    mounts
                        .iter()
                        .filter(|m| !inlet_plugin::local::content_mount::is_own(m))
                        .map(|m| shown(m)),
                );
                for dir in image_dirs {
                    let left = inlet_image::leftovers(dir);
                    report
                        .leftover_image_state
                        .extend(left.iter().map(|p| shown(p)));
                }
            }
            report
        };
        tokio::task::spawn_blocking(scan)
            .await
            .unwrap_or_else(|_| TeardownReport {
                complete,
                ..Default::default()
            })
    }
}
