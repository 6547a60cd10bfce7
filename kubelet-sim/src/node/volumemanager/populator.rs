//! The desired-state populator (`desired_state_of_world_populator.go`): adds the volumes of pods bound to
//! this node, resolving claims to their bound PVs, and removes the pods that are gone or terminated.

use std::sync::Arc;

use inlet_volume::PodInfo;
use inlet_volume::selinux::{self, SELINUX_MOUNT_READ_WRITE_ONCE_POD};
use k8s_openapi::api::core::v1::Pod;

use super::VolumeManager;
use super::desired_state::PodVolume;
use crate::api::ApiPod;
use crate::specs::{Reads, volume_spec};

impl VolumeManager {
    /// One pass: removes the volumes of pods gone from the API or whose containers are gone while they
    /// terminate (`terminated`, the pod workers' answer, as upstream's `podStateProvider`), then adds the
    /// volumes of `pods` (this node's, listed after `sources_ready` and `membership` were read) not added
    /// yet. Every pod is looked at on every pass, as upstream's `findAndAddNewPods`, so each lock is taken
    /// once a pass.
    ///
    /// The pods that are gone are looked for only when the node's pods (`membership`, see
    /// [`Api::pod_membership`](crate::api::Api::pod_membership)) or the terminated ones changed since the
    /// last look: most passes come of a pod's change or an operation's end, and the look hashed every
    /// pod's UID into a set (bench/RESULTS.md, issue #28's seventeenth pass).
    pub async fn populate(
        &self,
        sources_ready: bool,
        pods: &[Arc<ApiPod>],
        membership: u64,
        terminated: &foldhash::HashSet<String>,
    ) {
        let looked = self
            .gone_looked
            .lock()
            .as_ref()
            .is_some_and(|(m, t)| *m == membership && t == terminated);
        if looked {
            debug_assert!(
                self.gone_pods(pods, terminated).is_empty(),
                "a pod left unnoticed"
            );
        } else {
            for uid in self.gone_pods(pods, terminated) {
                let removed = self.dsw.lock().remove_pod(&uid);
                self.asw.lock().pod_changed(&uid);
                self.review_all(removed);
            }
            *self.gone_looked.lock() = Some((membership, terminated.clone()));
        }
        let unprocessed: Vec<(&ApiPod, &str, u64)> = {
            let processed = self.processed.lock();
            pods.iter()
                .filter(|pod| pod.metadata.deletion_timestamp.is_none())
                .filter_map(|pod| {
                    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
                    let fingerprint = metadata_fingerprint(pod);
                    (processed.get(uid) != Some(&fingerprint)).then_some((&**pod, uid, fingerprint))
                })
                .collect()
        };
        for (pod, uid, fingerprint) in unprocessed {
            let added = self.pod_volumes(pod).await.and_then(|volumes| {
                let mut dsw = self.dsw.lock();
                volumes
                    .into_iter()
                    .try_for_each(|(unique, attachable, mountable, volume)| {
                        dsw.add(&unique, attachable, mountable, volume)?;
                        self.review(&unique);
                        Ok(())
                    })
            });
            match added {
                Ok(()) => {
                    self.processed.lock().insert(uid.to_string(), fingerprint);
                    self.asw.lock().pod_changed(uid);
                    // A terminated pod added again is gone at the next look, which must come.
                    if terminated.contains(uid) {
                        *self.gone_looked.lock() = None;
                    }
                }
                Err(message) => self
                    .api
                    .record_event(pod, "Warning", "FailedMount", &message),
            }
        }
        if sources_ready {
            self.populator_has_added_pods
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// The pods in the desired state that are not among `pods` any more, or that terminated.
    fn gone_pods(
        &self,
        pods: &[Arc<ApiPod>],
        terminated: &foldhash::HashSet<String>,
    ) -> Vec<String> {
        let known: foldhash::HashSet<&str> = pods
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        let dsw = self.dsw.lock();
        dsw.pods()
            .filter(|uid| !known.contains(uid.as_str()) || terminated.contains(*uid))
            .cloned()
            .collect()
    }

    /// Every volume of a pod with its plugin's answers; the first error names the volume.
    async fn pod_volumes(
        &self,
        pod: &ApiPod,
    ) -> Result<Vec<(String, bool, bool, PodVolume)>, String> {
        let info = Arc::new(PodInfo::from_pod(pod));
        let selinux_contexts = selinux::container_contexts(pod);
        let change_policy = pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|c| c.se_linux_change_policy.as_deref());
        let mut out = Vec::new();
        for volume in pod.volumes() {
            let name = volume.name().to_string();
            let fail = |e: String| format!("MountVolume.SetUp failed for volume {name:?} : {e}");
            let (spec, read_only) =
                volume_spec(&self.api, Reads::Recorded, pod, &info, volume).map_err(fail)?;
            let plugin = self
                .plugins
                .iter()
                .find(|p| p.can_support(&spec))
                .ok_or_else(|| fail("no volume plugin matched".into()))?;
            let unique = plugin
                .unique_volume_name(&spec, &info)
                .await
                .map_err(|e| fail(e.message))?;
            let attachable = match plugin.attachable() {
                Some(a) => a
                    .can_attach(&spec, &info)
                    .await
                    .map_err(|e| fail(e.message))?,
                None => false,
            };
            let device_mountable = match plugin.device_mountable() {
                Some(d) => d
                    .can_device_mount(&spec, &info)
                    .await
                    .map_err(|e| fail(e.message))?,
                None => false,
            };
            let requires_republish = plugin.requires_remount(&spec, &info).await;
            // The CSIDriver is asked only where a label could come of it (`GetMountSELinuxLabel`).
            let gate = |g: &str| self.host.gates.contains(g);
            let plugin_supports = match self.host.selinux && gate(SELINUX_MOUNT_READ_WRITE_ONCE_POD)
            {
                true => plugin
                    .supports_selinux_context_mount(&spec)
                    .await
                    .map_err(|e| fail(e.message))?,
                false => false,
            };
            let contexts = selinux_contexts.get(&name).map(Vec::as_slice);
            let selinux = selinux::labels(
                &spec,
                contexts.unwrap_or_default(),
                change_policy,
                plugin_supports,
                self.host.selinux,
                gate,
            )
            .map_err(fail)?;
            let volume = PodVolume {
                pod: info.clone(),
                outer_name: name,
                spec,
                read_only,
                requires_republish,
                selinux,
            };
            out.push((unique, attachable, device_mountable, volume));
        }
        Ok(out)
    }
}

/// A hash of the pod's labels and annotations: what the downward API reads of a pod that may change.
fn metadata_fingerprint(pod: &Pod) -> u64 {
    use std::hash::BuildHasher;
    // Compared within this process only, on every pass for every pod: foldhash with a fixed seed.
    foldhash::quality::FixedState::default()
        .hash_one((&pod.metadata.labels, &pod.metadata.annotations))
}
