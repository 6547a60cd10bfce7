//! What a check leaves behind: on the node (pods not torn down, their directories, mounts below them)
//! and in the driver (volumes it still holds), whichever node the check ran on.

use inlet_proto::csi::v1 as csi;

use super::cluster::{self, ClusterNode};
use super::{Backend, CheckEnv};
use crate::conform::driver::DriverRun;
use crate::drivers::DriverSource;

impl CheckEnv {
    /// Deletes every pod left and fails if anything is: a mount or a pod directory under the node's root
    /// (the kubelet's view), or, where the driver can be asked, a volume the driver still holds after its
    /// last unpublish (`volume_ids`).
    pub async fn nothing_left(&self, volume_ids: &[String]) -> Result<(), String> {
        let sim = match &self.backend {
            Backend::Sim(sim) => sim,
            Backend::Cluster(node) => {
                let mut left = self.cluster_leftovers(node).await;
                left.extend(self.driver_holds(volume_ids).await?);
                return match left.is_empty() {
                    true => Ok(()),
                    false => Err(format!("left behind: {}", left.join(", "))),
                };
            }
        };
        let teardown = sim.teardown(self.conf.wait).await;
        let mut left: Vec<String> = Vec::new();
        if !teardown.complete {
            left.push("the pods were not all torn down".into());
        }
        left.extend(
            teardown
                .leftover_mounts
                .iter()
                .map(|m| format!("mount {m}")),
        );
        left.extend(
            teardown
                .leftover_pod_dirs
                .iter()
                .map(|d| format!("pod dir {d}")),
        );
        left.extend(
            teardown
                .leftover_attachments
                .iter()
                .map(|a| format!("VolumeAttachment {a}")),
        );
        left.extend(self.driver_holds(volume_ids).await?);
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("left behind: {}", left.join(", ")))
        }
    }

    /// Deletes this check's pods on the real node and says what is left: pods the kubelet did not let go,
    /// and their pod dirs and mounts.
    async fn cluster_leftovers(&self, node: &ClusterNode) -> Vec<String> {
        for name in node.pods_of(&self.uids) {
            if let Err(e) = node.delete_pod(&name, &self.uid(&name)).await {
                return vec![e];
            }
        }
        let kubelet_dir = self.node_root();
        let mounter = &*self.conf.mounter.0;
        let clean = |_: &Self| {
            node.pods_of(&self.uids).is_empty()
                && cluster::left_in(&kubelet_dir, &self.uids, mounter).is_empty()
        };
        self.until(clean).await;
        let mut left: Vec<String> = node
            .pods_of(&self.uids)
            .into_iter()
            .map(|n| format!("pod {n} (not torn down)"))
            .collect();
        left.extend(cluster::left_in(&kubelet_dir, &self.uids, mounter));
        left
    }

    /// Whether [`Self::nothing_left`] can see the driver's own volumes: an in-process driver's state, or
    /// an external driver's ListVolumes.
    pub fn can_see_driver_volumes(&self) -> bool {
        matches!(self.driver, DriverRun::InProcess(_))
            || self.conf.info.controller_has("LIST_VOLUMES")
    }

    /// What the driver still holds of `volume_ids`: files named after them in an in-process driver's
    /// state (and an image driver's volume state), or volumes an external driver lists (LIST_VOLUMES).
    async fn driver_holds(&self, volume_ids: &[String]) -> Result<Vec<String>, String> {
        let mut held = Vec::new();
        match &self.driver {
            DriverRun::InProcess(_) => {
                let state = self
                    .node_root()
                    .join("plugins")
                    .join(self.conf.setup.name())
                    .join("state");
                for entry in walkdir::WalkDir::new(&state).into_iter().flatten() {
                    let name = entry.file_name().to_string_lossy();
                    if volume_ids.iter().any(|id| name.contains(id.as_str())) {
                        held.push(format!("driver state {}", entry.path().display()));
                    }
                }
                if self.conf.setup.arg.source == DriverSource::Image {
                    held.extend(
                        inlet_image::leftovers(&state)
                            .into_iter()
                            .map(|p| format!("image volume state {}", p.display())),
                    );
                }
            }
            DriverRun::External if self.conf.info.controller_has("LIST_VOLUMES") => {
                let listed = self
                    .controller()
                    .await?
                    .list_volumes(csi::ListVolumesRequest::default())
                    .await
                    .map_err(|s| format!("ListVolumes: {}", s.message()))?
                    .into_inner();
                held.extend(
                    listed
                        .entries
                        .into_iter()
                        .filter_map(|e| e.volume.map(|v| v.volume_id))
                        .filter(|id| volume_ids.contains(id))
                        .map(|id| format!("volume {id} (still in ListVolumes)")),
                );
            }
            DriverRun::External => {}
        }
        Ok(held)
    }
}
