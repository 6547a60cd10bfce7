//! Stopping a pod, as kuberuntime does (`kuberuntime_container.go`): `killPodWithSyncResult` stops the
//! running containers side by side (`killContainersWithSyncResult`), each through `killContainer` (the
//! Killing event, the preStop hook within the grace period, then StopContainer with what is left of it,
//! never under 2 s), then the sandbox.

use std::sync::Arc;
use std::time::{Duration, Instant};

use inlet_proto::runtime::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};

use super::Kubelet;
use super::kuberuntime::{ContainerReport, ContainerState, all_containers};
use super::pod_worker::PodState;
use crate::api::ApiPod;

/// `minimumGracePeriodInSeconds`: the least time StopContainer gives a container, whatever its hook took.
const MINIMUM_GRACE_PERIOD: i64 = 2;

impl Kubelet {
    /// Stops a pod's containers and its sandbox (`killPodWithSyncResult`), then marks it terminated so
    /// its volumes are torn down.
    pub(super) async fn kill(self: Arc<Self>, pod: Arc<ApiPod>) -> bool {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let (sandbox, mut containers) = self
            .pods
            .lock()
            .get(&uid)
            .map(|r| (r.sandbox_id.clone(), r.containers.clone()))
            .unwrap_or_default();
        // Only running containers are stopped, and get a Killing event (`killContainersWithSyncResult`
        // walks the running pod's containers): one that exited, or waits to be created, has nothing to
        // stop. They stop side by side, so one container's long preStop hook holds up no other.
        let stopped = containers
            .iter_mut()
            .filter(|c| c.state == ContainerState::Running)
            .map(|report| self.kill_container(&pod, report));
        if !futures::future::join_all(stopped)
            .await
            .into_iter()
            .all(|ok| ok)
        {
            return false;
        }
        if let Some(sandbox) = sandbox {
            let mut runtime = self.cri.runtime.clone();
            if runtime
                .stop_pod_sandbox(cri::StopPodSandboxRequest {
                    pod_sandbox_id: sandbox.clone(),
                })
                .await
                .is_err()
                || runtime
                    .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                        pod_sandbox_id: sandbox,
                    })
                    .await
                    .is_err()
            {
                return false;
            }
        }
        if let Some(rt) = self.pods.lock().get_mut(&uid) {
            rt.state = PodState::Terminated;
            rt.containers = containers.clone();
        }
        // The pod's last status, terminal (`podIsTerminal`): an ended pod keeps it, now without a sandbox
        // (PodReadyToStartContainers False); a deleted one shows Succeeded or Failed from its containers'
        // exits until its volumes are torn down and it leaves the API (since 1.27).
        self.set_status_releasing(pod, &containers, true);
        true
    }

    /// `killContainer`: the Killing event, the container's preStop hook if the grace period leaves time
    /// for one, then StopContainer with the seconds left (at least 2); its exit is recorded.
    async fn kill_container(&self, pod: &Pod, report: &mut ContainerReport) -> bool {
        let spec = all_containers(pod).find(|c| c.name == report.name);
        let mut grace = grace_period(pod);
        self.api.record_container_event(
            pod,
            &report.name,
            "Normal",
            "Killing",
            &format!("Stopping container {}", report.name),
        );
        if let Some(spec) = spec.filter(|_| grace > 0) {
            grace -= self.pre_stop(pod, spec, &report.id, grace).await;
        }
        let request = cri::StopContainerRequest {
            container_id: report.id.clone(),
            timeout: grace.max(MINIMUM_GRACE_PERIOD),
        };
        if self
            .cri
            .runtime
            .clone()
            .stop_container(request)
            .await
            .is_err()
        {
            return false;
        }
        self.record_exit(pod, report).await;
        report.restart_at = None;
        true
    }

    /// `executePreStopHook`: runs the container's preStop handler for at most `grace` seconds, and
    /// returns the whole seconds it took. A failed hook is a `FailedPreStopHook` event without the
    /// handler's message, which may hold secrets; the stop goes on either way.
    async fn pre_stop(&self, pod: &Pod, container: &Container, id: &str, grace: i64) -> i64 {
        let Some(handler) = container
            .lifecycle
            .as_ref()
            .and_then(|l| l.pre_stop.as_ref())
        else {
            return 0;
        };
        let started = Instant::now();
        let limit = Duration::from_secs(grace as u64);
        let run = self.run_handler(pod, container, id, handler);
        match tokio::time::timeout(limit, run).await {
            Ok(Ok(())) => {}
            // Neither the log nor the event carries the hook's error: its command line and output may
            // hold secrets.
            Ok(Err(_)) => {
                tracing::info!(pod = %pod.metadata.name.as_deref().unwrap_or_default(),
                    container = %container.name, "PreStop hook failed");
                self.api.record_container_event(
                    pod,
                    &container.name,
                    "Warning",
                    "FailedPreStopHook",
                    "PreStopHook failed",
                );
            }
            Err(_) => tracing::info!(
                pod = %pod.metadata.name.as_deref().unwrap_or_default(),
                container = %container.name,
                grace,
                "PreStop hook not completed in grace period"
            ),
        }
        started.elapsed().as_secs() as i64
    }
}

/// The seconds a container gets to stop (`setTerminationGracePeriod`): the deletion's grace period, else
/// the pod's `terminationGracePeriodSeconds` (30 when unset, as the API server defaults it). A preStop
/// hook runs only when this is above 0, and StopContainer never gets under 2 s.
fn grace_period(pod: &Pod) -> i64 {
    pod.metadata
        .deletion_grace_period_seconds
        .or_else(|| pod.spec.as_ref()?.termination_grace_period_seconds)
        .unwrap_or(30)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    #[test]
    fn the_grace_period_is_the_deletions_then_the_pods() {
        let mut pod = Pod::default();
        assert_eq!(grace_period(&pod), 30, "the API server's default");
        pod.spec = Some(PodSpec {
            termination_grace_period_seconds: Some(0),
            ..Default::default()
        });
        assert_eq!(grace_period(&pod), 0);
        pod.metadata.deletion_grace_period_seconds = Some(45);
        assert_eq!(grace_period(&pod), 45);
    }
}
