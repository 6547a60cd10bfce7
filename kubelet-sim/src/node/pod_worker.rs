//! Pod workers (`pod_workers.go`, much reduced): each pod's state on the node, moved on by `sync_pods` on
//! every pass. A pod starts (through kuberuntime) once the volume manager says its volumes are attached
//! and mounted; a deleted pod is stopped, its volumes are torn down by the volume manager's reconciler, its
//! directory is removed, and then it leaves the API. Its status is written here (`status_manager.go`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{
    ContainerState as ApiContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod, PodCondition, PodStatus,
};

use super::Kubelet;
use super::kuberuntime::{ContainerReport, ContainerState};
use crate::api::now;
use crate::operations::OpKey;

/// Where a pod is in its life on the node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub enum PodState {
    /// Waiting for volumes (or retrying a failed start).
    #[default]
    Waiting,
    /// Being started through CRI.
    Starting,
    /// Containers started.
    Running,
    /// Being stopped through CRI.
    Killing,
    /// Containers and sandbox gone; volumes are being torn down.
    Terminated,
}

/// What the pod workers know of one pod.
#[derive(Debug, Clone, Default)]
pub struct PodRuntime {
    /// Its state.
    pub state: PodState,
    /// When the node first saw it.
    pub seen_at: Option<Instant>,
    /// The volume-wait timeout event was recorded.
    pub warned: bool,
    /// The sandbox, once created.
    pub sandbox_id: Option<String>,
    /// Its containers, once created.
    pub containers: Vec<ContainerReport>,
    /// The pod object as last seen, to stop it if it leaves the API without a graceful deletion.
    pub pod: Option<Arc<Pod>>,
}

impl PodRuntime {
    /// True once containers and sandbox are gone.
    pub fn terminated(&self) -> bool {
        self.state == PodState::Terminated
    }
}

impl Kubelet {
    pub(super) async fn sync_pods(self: &Arc<Self>) {
        let pods = self.my_pods();
        self.stop_removed_pods(&pods);
        for pod in pods {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let (state, seen_at, warned) = {
                let mut pods = self.pods.lock();
                let rt = pods.entry(uid.clone()).or_default();
                rt.pod = Some(Arc::clone(&pod));
                let seen = *rt.seen_at.get_or_insert_with(Instant::now);
                (rt.state, seen, rt.warned)
            };
            let key = OpKey::Pod(uid.clone());
            if pod.metadata.deletion_timestamp.is_some() {
                match state {
                    PodState::Waiting | PodState::Running => {
                        self.set_state(&uid, PodState::Killing);
                        let object = pod.clone();
                        self.spawn_pod_op(key, &uid, state, move |me| me.kill(object));
                    }
                    PodState::Terminated => self.finish_termination(&pod, &uid),
                    PodState::Starting | PodState::Killing => {}
                }
                continue;
            }
            if state != PodState::Waiting {
                continue;
            }
            match self.volumes.wait_for_attach_and_mount(&uid) {
                Ok(()) => {
                    self.set_state(&uid, PodState::Starting);
                    let object = pod.clone();
                    self.spawn_pod_op(key, &uid, PodState::Waiting, move |me| me.start(object));
                }
                Err(_) if !warned && seen_at.elapsed() >= self.config.volume_wait_timeout => {
                    self.warn_volume_timeout(&pod, &uid);
                }
                Err(_) => {}
            }
        }
    }

    /// Stops the pods that left the API without a graceful deletion (a force delete), as upstream's
    /// `HandlePodRemoves`: their containers and sandbox are stopped, and their directory goes once their
    /// volumes are torn down (the populator already dropped them). Only after the API's sources are ready:
    /// before, a missing pod may just not be loaded yet.
    fn stop_removed_pods(self: &Arc<Self>, present: &[Arc<Pod>]) {
        if !self.api.sources_ready() {
            return;
        }
        let present: std::collections::HashSet<&str> = present
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        let removed: Vec<(String, Arc<Pod>, PodState)> = self
            .pods
            .lock()
            .iter()
            .filter(|(uid, _)| !present.contains(uid.as_str()))
            .filter_map(|(uid, rt)| Some((uid.clone(), rt.pod.clone()?, rt.state)))
            .collect();
        for (uid, pod, state) in removed {
            let key = OpKey::Pod(uid.clone());
            match state {
                PodState::Waiting | PodState::Running => {
                    self.set_state(&uid, PodState::Killing);
                    self.spawn_pod_op(key, &uid, state, move |me| me.kill(pod));
                }
                PodState::Terminated => self.finish_termination(&pod, &uid),
                PodState::Starting | PodState::Killing => {}
            }
        }
    }

    /// The kubelet's event after waiting too long for volumes (`volume_manager.go` WaitForAttachAndMount).
    fn warn_volume_timeout(&self, pod: &Pod, uid: &str) {
        let missing = self.volumes.missing_volumes(uid);
        let (mut unmounted, unattached) = (missing.unmounted, missing.unattached);
        if unmounted.is_empty() {
            unmounted = pod
                .spec
                .as_ref()
                .and_then(|s| s.volumes.as_ref())
                .map(|v| v.iter().map(|v| v.name.clone()).collect())
                .unwrap_or_default();
        }
        let message = format!(
            "Unable to attach or mount volumes: unmounted volumes=[{}], unattached volumes=[{}]: timed out waiting for the condition",
            unmounted.join(" "),
            unattached.join(" ")
        );
        self.api
            .record_event(pod, "Warning", "FailedMount", &message);
        if let Some(rt) = self.pods.lock().get_mut(uid) {
            rt.warned = true;
        }
    }

    pub(super) fn set_state(&self, uid: &str, state: PodState) {
        if let Some(rt) = self.pods.lock().get_mut(uid) {
            rt.state = state;
        }
    }

    /// Runs a pod operation; on failure the pod goes back to `retry_state` and is retried after backoff.
    pub(super) fn spawn_pod_op<F, Fut>(
        self: &Arc<Self>,
        key: OpKey,
        uid: &str,
        retry_state: PodState,
        op: F,
    ) where
        F: FnOnce(Arc<Self>) -> Fut,
        Fut: std::future::Future<Output = bool> + Send + 'static,
    {
        if !self.pod_ops.lock().try_start(&key) {
            self.set_state(uid, retry_state);
            return;
        }
        let me = Arc::clone(self);
        let uid = uid.to_string();
        let run = op(Arc::clone(self));
        tokio::spawn(async move {
            let ok = run.await;
            if !ok {
                me.set_state(&uid, retry_state);
            }
            me.pod_ops.lock().finish(&key, ok);
            me.kick.notify_one();
        });
    }

    /// The pod's status: its phase, and each container's state as the runtime last reported it.
    pub(super) fn set_status(&self, pod: &Pod, containers: &[ContainerReport], phase: &str) {
        let (namespace, name) = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let condition = |t: &str| PodCondition {
            type_: t.into(),
            status: "True".into(),
            last_transition_time: Some(now()),
            ..Default::default()
        };
        let images: HashMap<String, String> = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
            .collect();
        let statuses = containers
            .iter()
            .map(|c| ContainerStatus {
                name: c.name.clone(),
                container_id: Some(format!("cri://{}", c.id)),
                image: images.get(&c.name).cloned().unwrap_or_default(),
                ready: c.state == ContainerState::Running,
                started: Some(c.state == ContainerState::Running),
                restart_count: i32::try_from(c.restart_count).unwrap_or(i32::MAX),
                state: Some(container_state(c)),
                ..Default::default()
            })
            .collect();
        let running = phase == "Running";
        let conditions = ["PodReadyToStartContainers", "Initialized"]
            .into_iter()
            .chain(
                running
                    .then_some(["ContainersReady", "Ready"])
                    .into_iter()
                    .flatten(),
            )
            .chain(["PodScheduled"]);
        self.api.update::<Pod>(&namespace, &name, |p| {
            // When the node first started working on the pod, kept from then on.
            let start_time = p.status.as_ref().and_then(|s| s.start_time.clone());
            p.status = Some(PodStatus {
                phase: Some(phase.into()),
                conditions: Some(conditions.clone().map(condition).collect()),
                container_statuses: Some(statuses),
                host_ip: Some("127.0.0.1".into()),
                start_time: start_time.or_else(|| Some(now())),
                ..Default::default()
            });
        });
    }

    /// Once a terminated pod has no volume left, removes its directory (never through a mount) and the
    /// pod object.
    fn finish_termination(&self, pod: &Pod, uid: &str) {
        if self.volumes.pod_volumes_exist(uid) {
            return;
        }
        let dir = self.config.root.join("pods").join(uid);
        if self.volumes.mounter().anything_mounted_under(&dir) {
            tracing::warn!(
                pod = uid,
                "something is still mounted under {}; leaving it",
                dir.display()
            );
            return;
        }
        let _ = std::fs::remove_dir_all(&dir);
        let meta = &pod.metadata;
        let log_dir = self.config.root.join("logs").join(format!(
            "{}_{}_{uid}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        ));
        let _ = std::fs::remove_dir_all(log_dir);
        self.api.remove_finished_pod(
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
            uid,
        );
        self.pods.lock().remove(uid);
        self.volumes.forget_pod(uid);
    }
}

/// A container's state in the API, from what the runtime last reported.
fn container_state(c: &ContainerReport) -> ApiContainerState {
    match c.state {
        ContainerState::Terminated => ApiContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: c.exit_code.unwrap_or_default(),
                reason: Some(c.reason.clone()).filter(|r| !r.is_empty()),
                finished_at: Some(now()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ContainerState::Waiting => ApiContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(c.reason.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ContainerState::Running => ApiContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(now()),
            }),
            ..Default::default()
        },
    }
}
