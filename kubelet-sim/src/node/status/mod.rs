//! The pod's status as the kubelet writes it: container statuses (`kubelet_pods.go`
//! convertToAPIContainerStatuses), the phase (`getPhase`), the conditions (`status/generate.go`), and, as
//! the status manager keeps them, the conditions others own and each condition's `lastTransitionTime`
//! (`status_manager.go` updateLastTransitionTime). The texts are those of 1.35.
//!
//! - `mod.rs`: generating and writing the status; container statuses.
//! - `phase.rs`: `getPhase`.
//! - `conditions.rs`: the conditions of `status/generate.go`, and transition times.
//! - `terminate.rs`: TerminatePod's last word on a pod that will run nothing again.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    Container, ContainerState as ApiContainerState, ContainerStateRunning,
    ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition,
    PodIP, PodSpec, PodStatus,
};

use super::Kubelet;
use super::kuberuntime::{ContainerReport, ContainerState, TerminatedRun};
use crate::api::{ApiPod, now};
use conditions::{
    condition, containers_ready_condition, initialized_condition, keep_transition_times,
    ready_condition,
};
use phase::get_phase;

mod conditions;
mod phase;
mod terminate;
#[cfg(test)]
mod tests;

/// The conditions the kubelet writes (`kubetypes.PodConditionsByKubelet` and PodReadyToStartContainers);
/// any other is kept as whoever wrote it left it.
const KUBELET_CONDITIONS: [&str; 5] = [
    "PodScheduled",
    "Ready",
    "Initialized",
    "ContainersReady",
    "PodReadyToStartContainers",
];

impl Kubelet {
    /// Writes the pod's status from its containers as the runtime last reported them (init and regular
    /// containers in one list), and returns the phase written. `terminal`: no container will run again
    /// (`podIsTerminal`).
    pub(super) fn set_status(
        &self,
        pod: &Pod,
        containers: &[ContainerReport],
        terminal: bool,
    ) -> &'static str {
        let status = self.generate_status(pod, containers, terminal);
        let phase = status.phase;
        self.write_status(&PodName::of(pod), status);
        phase
    }

    /// [`Self::set_status`] by the last holder of `pod` besides the API (a start or a stop that ends):
    /// the pod is let go before the write, so the API changes its own in place instead of copying it.
    pub(super) fn set_status_releasing(
        &self,
        pod: Arc<ApiPod>,
        containers: &[ContainerReport],
        terminal: bool,
    ) {
        let status = self.generate_status(&pod, containers, terminal);
        let name = PodName::of(&pod);
        drop(pod);
        self.write_status(&name, status);
    }

    /// For a pod with readiness gates: writes its status again when a condition someone else owns changed
    /// what `Ready` says (the status manager regenerates the status on every sync).
    pub(super) fn sync_readiness_gates(&self, pod: &Pod, containers: &[ContainerReport]) {
        let status = self.generate_status(pod, containers, false);
        let shown = |c: &PodCondition| (c.type_.clone(), c.status.clone(), c.reason.clone());
        let current = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
        let ready_now = current
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .map(shown);
        if ready_now != Some(shown(&status.ready)) {
            self.write_status(&PodName::of(pod), status);
        }
    }

    fn generate_status(
        &self,
        pod: &Pod,
        containers: &[ContainerReport],
        terminal: bool,
    ) -> Generated {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let sandbox_ready = self
            .pods
            .lock()
            .get(&uid)
            .is_some_and(|rt| rt.sandbox_id.is_some() && !rt.terminated());
        let no_spec = PodSpec::default();
        let spec = pod.spec.as_ref().unwrap_or(&no_spec);
        let runtime = &self.cri.runtime_name;
        let init = spec.init_containers.as_deref().unwrap_or_default();
        let init_statuses = api_statuses(spec, init, containers, runtime);
        let statuses = api_statuses(spec, &spec.containers, containers, runtime);
        let all: Vec<ContainerStatus> = statuses.iter().chain(&init_statuses).cloned().collect();
        let phase = get_phase(spec, &all, terminal);
        // Others' conditions as the API has them now: the readiness gates read them.
        let others: Vec<PodCondition> = pod
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .filter(|c| owned_by_others(c))
            .cloned()
            .collect();
        let sandbox = if sandbox_ready { "True" } else { "False" };
        let mut generated = Generated {
            phase,
            ready_to_start: condition("PodReadyToStartContainers", sandbox, "", String::new()),
            initialized: initialized_condition(spec, &all, phase),
            ready: ready_condition(spec, &others, &all, phase),
            containers_ready: containers_ready_condition(spec, &all, phase),
            statuses,
            init_statuses,
        };
        if terminal {
            generated.phase = terminate::terminate_pod(
                spec,
                phase,
                &mut generated.statuses,
                &mut generated.init_statuses,
            );
        }
        generated
    }

    fn write_status(&self, pod: &PodName, status: Generated) {
        let PodName {
            namespace,
            name,
            uid,
        } = pod;
        let pod_ip = self.pods.lock().get(uid).and_then(|rt| rt.pod_ip.clone());
        self.api.update::<ApiPod>(namespace, name, |p| {
            // Not onto another pod of the same name (one made after a force delete of this one).
            if p.metadata.uid.as_deref().unwrap_or_default() != uid {
                return;
            }
            let old = p.status.clone().unwrap_or_default();
            // The kubelet's conditions after the others', in `generateAPIPodStatus`' order.
            let mut conditions: Vec<PodCondition> = old
                .conditions
                .iter()
                .flatten()
                .filter(|c| owned_by_others(c))
                .cloned()
                .chain([
                    status.ready_to_start,
                    status.initialized,
                    status.ready,
                    status.containers_ready,
                    condition("PodScheduled", "True", "", String::new()),
                ])
                .collect();
            keep_transition_times(
                &mut conditions,
                old.conditions.as_deref().unwrap_or_default(),
            );
            p.status = Some(PodStatus {
                phase: Some(status.phase.into()),
                conditions: Some(conditions),
                container_statuses: Some(status.statuses),
                init_container_statuses: Some(status.init_statuses).filter(|s| !s.is_empty()),
                host_ip: Some("127.0.0.1".into()),
                host_ips: Some(vec![HostIP {
                    ip: "127.0.0.1".into(),
                }]),
                pod_ip: pod_ip.clone(),
                pod_ips: pod_ip.clone().map(|ip| vec![PodIP { ip }]),
                // When the node first started working on the pod, kept from then on.
                start_time: old.start_time.or_else(|| Some(now())),
                ..Default::default()
            });
        });
    }
}

/// Which pod a status is written to.
struct PodName {
    namespace: String,
    name: String,
    uid: String,
}

impl PodName {
    fn of(pod: &Pod) -> Self {
        let meta = &pod.metadata;
        Self {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
        }
    }
}

/// A pod's status as generated, before the status manager merges it with the API's.
struct Generated {
    phase: &'static str,
    ready_to_start: PodCondition,
    initialized: PodCondition,
    ready: PodCondition,
    containers_ready: PodCondition,
    statuses: Vec<ContainerStatus>,
    init_statuses: Vec<ContainerStatus>,
}

/// True for a condition the kubelet does not write, kept as whoever wrote it left it.
fn owned_by_others(condition: &PodCondition) -> bool {
    !KUBELET_CONDITIONS.contains(&condition.type_.as_str())
}

/// `IsRestartableInitContainer`: an init container with `restartPolicy: Always` (a sidecar).
pub fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// The API statuses of `specs` (init or regular containers), in spec order; a container the runtime has not
/// reported yet waits with `ContainerCreating`, or `PodInitializing` in a pod with init containers.
fn api_statuses(
    spec: &PodSpec,
    specs: &[Container],
    reports: &[ContainerReport],
    runtime: &str,
) -> Vec<ContainerStatus> {
    let default_reason = if spec.init_containers.as_ref().is_some_and(|i| !i.is_empty()) {
        "PodInitializing"
    } else {
        "ContainerCreating"
    };
    specs
        .iter()
        .map(|c| {
            let image = c.image.clone().unwrap_or_default();
            match reports.iter().find(|r| r.name == c.name) {
                Some(r) => api_status(c, r, image, runtime),
                None => ContainerStatus {
                    name: c.name.clone(),
                    image,
                    started: Some(false),
                    state: Some(ApiContainerState {
                        waiting: Some(ContainerStateWaiting {
                            reason: Some(default_reason.into()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            }
        })
        .collect()
}

/// A run that ended, as the API shows it.
fn terminated(run: &TerminatedRun, runtime: &str) -> ApiContainerState {
    ApiContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: run.exit_code,
            reason: Some(run.reason.clone()).filter(|r| !r.is_empty()),
            started_at: run.started_at.clone(),
            finished_at: run.finished_at.clone(),
            container_id: container_id(&run.id, runtime),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `<runtime>://<id>` (`kubecontainer.ContainerID`), none before the container is created.
fn container_id(id: &str, runtime: &str) -> Option<String> {
    (!id.is_empty()).then(|| format!("{runtime}://{id}"))
}

/// One container's API status from what the runtime last reported.
fn api_status(
    spec: &Container,
    report: &ContainerReport,
    image: String,
    runtime: &str,
) -> ContainerStatus {
    let running = report.state == ContainerState::Running;
    let state = match report.state {
        ContainerState::Running => ApiContainerState {
            running: Some(ContainerStateRunning {
                started_at: report.started_at.clone(),
            }),
            ..Default::default()
        },
        ContainerState::Terminated => terminated(&report.run(), runtime),
        ContainerState::Waiting => ApiContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(report.reason.clone()).filter(|r| !r.is_empty()),
                message: Some(report.message.clone()).filter(|m| !m.is_empty()),
            }),
            ..Default::default()
        },
    };
    let last_state = report
        .last_state
        .as_ref()
        .map(|run| terminated(run, runtime));
    // A regular init container is ready once it completed; any other once it runs (no probes here).
    let ready = if report.init && !is_sidecar(spec) {
        report.state == ContainerState::Terminated && report.exit_code == Some(0)
    } else {
        running
    };
    ContainerStatus {
        name: report.name.clone(),
        image,
        image_id: report.image_id.clone(),
        container_id: container_id(&report.id, runtime),
        ready,
        started: Some(running),
        restart_count: i32::try_from(report.restart_count).unwrap_or(i32::MAX),
        state: Some(state),
        last_state,
        ..Default::default()
    }
}
