//! The pod's status as the kubelet writes it: container statuses (`kubelet_pods.go`
//! convertToAPIContainerStatuses), the phase (`getPhase`), the conditions (`status/generate.go`), and, as
//! the status manager keeps them, the conditions others own and each condition's `lastTransitionTime`
//! (`status_manager.go` updateLastTransitionTime). The texts are those of 1.35.

use k8s_openapi::api::core::v1::{
    Container, ContainerState as ApiContainerState, ContainerStateRunning,
    ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, Pod, PodCondition, PodSpec,
    PodStatus,
};

use super::Kubelet;
use super::kuberuntime::{ContainerReport, ContainerState, TerminatedRun};
use crate::api::now;

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
        self.write_status(pod, status);
        phase
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
            self.write_status(pod, status);
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
        let spec = pod.spec.clone().unwrap_or_default();
        let runtime = &self.cri.runtime_name;
        let init_statuses = api_statuses(&spec, &spec.init_containers, containers, runtime);
        let statuses = api_statuses(&spec, &Some(spec.containers.clone()), containers, runtime);
        let all: Vec<ContainerStatus> = statuses.iter().chain(&init_statuses).cloned().collect();
        let phase = get_phase(&spec, &all, terminal);
        // Others' conditions as the API has them now: the readiness gates read them.
        let others: Vec<PodCondition> = pod
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .filter(|c| !KUBELET_CONDITIONS.contains(&c.type_.as_str()))
            .cloned()
            .collect();
        let sandbox = if sandbox_ready { "True" } else { "False" };
        Generated {
            phase,
            ready_to_start: condition("PodReadyToStartContainers", sandbox, "", String::new()),
            initialized: initialized_condition(&spec, &all, phase),
            ready: ready_condition(&spec, &others, &all, phase),
            containers_ready: containers_ready_condition(&spec, &all, phase),
            statuses,
            init_statuses,
        }
    }

    fn write_status(&self, pod: &Pod, status: Generated) {
        let (namespace, name) = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        self.api.update::<Pod>(&namespace, &name, |p| {
            let old = p.status.clone().unwrap_or_default();
            // The kubelet's conditions after the others', in `generateAPIPodStatus`' order.
            let mut conditions: Vec<PodCondition> = old
                .conditions
                .iter()
                .flatten()
                .filter(|c| !KUBELET_CONDITIONS.contains(&c.type_.as_str()))
                .cloned()
                .chain([
                    status.ready_to_start.clone(),
                    status.initialized.clone(),
                    status.ready.clone(),
                    status.containers_ready.clone(),
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
                container_statuses: Some(status.statuses.clone()),
                init_container_statuses: Some(status.init_statuses.clone())
                    .filter(|s| !s.is_empty()),
                host_ip: Some("127.0.0.1".into()),
                // When the node first started working on the pod, kept from then on.
                start_time: old.start_time.or_else(|| Some(now())),
                ..Default::default()
            });
        });
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

/// `IsRestartableInitContainer`: an init container with `restartPolicy: Always` (a sidecar).
pub fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// The API statuses of `specs` (init or regular containers), in spec order; a container the runtime has not
/// reported yet waits with `ContainerCreating`, or `PodInitializing` in a pod with init containers.
fn api_statuses(
    spec: &PodSpec,
    specs: &Option<Vec<Container>>,
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
        .flatten()
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

/// One container's API status from what the runtime last reported.
fn api_status(
    spec: &Container,
    report: &ContainerReport,
    image: String,
    runtime: &str,
) -> ContainerStatus {
    let container_id = |id: &str| (!id.is_empty()).then(|| format!("{runtime}://{id}"));
    let running = report.state == ContainerState::Running;
    let state = match report.state {
        ContainerState::Running => ApiContainerState {
            running: Some(ContainerStateRunning {
                started_at: report.started_at.clone(),
            }),
            ..Default::default()
        },
        ContainerState::Terminated => ApiContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: report.exit_code.unwrap_or_default(),
                reason: Some(report.reason.clone()).filter(|r| !r.is_empty()),
                started_at: report.started_at.clone(),
                finished_at: report.finished_at.clone(),
                container_id: container_id(&report.id),
                ..Default::default()
            }),
            ..Default::default()
        },
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
        .map(|run: &TerminatedRun| ApiContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: run.exit_code,
                reason: Some(run.reason.clone()).filter(|r| !r.is_empty()),
                started_at: run.started_at.clone(),
                finished_at: run.finished_at.clone(),
                container_id: container_id(&run.id),
                ..Default::default()
            }),
            ..Default::default()
        });
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
        container_id: container_id(&report.id),
        ready,
        started: Some(running),
        restart_count: i32::try_from(report.restart_count).unwrap_or(i32::MAX),
        state: Some(state),
        last_state,
        ..Default::default()
    }
}

fn status_of<'a>(statuses: &'a [ContainerStatus], name: &str) -> Option<&'a ContainerStatus> {
    statuses.iter().find(|s| s.name == name)
}

fn last_terminated(status: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    status.last_state.as_ref()?.terminated.as_ref()
}

/// `getPhase` (`kubelet_pods.go`, without the alpha ContainerRestartRules).
pub fn get_phase(spec: &PodSpec, statuses: &[ContainerStatus], terminal: bool) -> &'static str {
    let (mut pending_init, mut pending_sidecars, mut failed_init) = (0, 0, 0);
    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    let init = spec.init_containers.as_deref().unwrap_or_default();
    for container in init.iter().filter(|c| !is_sidecar(c)) {
        let Some(status) = status_of(statuses, &container.name) else {
            pending_init += 1;
            continue;
        };
        let state = status.state.clone().unwrap_or_default();
        match (&state.running, &state.terminated, &state.waiting) {
            (Some(_), _, _) => pending_init += 1,
            (_, Some(t), _) => failed_init += usize::from(t.exit_code != 0),
            (_, _, Some(_)) => match last_terminated(status) {
                Some(t) => failed_init += usize::from(t.exit_code != 0),
                None => pending_init += 1,
            },
            _ => pending_init += 1,
        }
    }
    // Sidecars stop with a pod whose regular containers are done for good.
    for container in init.iter().filter(|c| is_sidecar(c) && !terminal) {
        let Some(status) = status_of(statuses, &container.name) else {
            unknown += 1;
            continue;
        };
        let state = status.state.clone().unwrap_or_default();
        match (&state.running, &state.terminated, &state.waiting) {
            (Some(_), _, _) => {
                pending_sidecars += usize::from(status.started != Some(true));
                running += 1;
            }
            // Sidecars that stopped do not count for the phase.
            (_, Some(_), _) => {}
            (_, _, Some(_)) if last_terminated(status).is_some() => {}
            (_, _, Some(_)) => {
                pending_sidecars += 1;
                waiting += 1;
            }
            _ => {
                pending_sidecars += 1;
                unknown += 1;
            }
        }
    }
    for container in &spec.containers {
        let Some(status) = status_of(statuses, &container.name) else {
            unknown += 1;
            continue;
        };
        let state = status.state.clone().unwrap_or_default();
        match (&state.running, &state.terminated, &state.waiting) {
            (Some(_), _, _) => running += 1,
            (_, Some(t), _) => {
                stopped += 1;
                succeeded += usize::from(t.exit_code == 0);
            }
            (_, _, Some(_)) if last_terminated(status).is_some() => stopped += 1,
            (_, _, Some(_)) => waiting += 1,
            _ => unknown += 1,
        }
    }
    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    if failed_init > 0 && policy == "Never" {
        return "Failed";
    }
    let initialized = spec.containers.iter().any(|c| {
        status_of(statuses, &c.name).is_some_and(|s| {
            s.state.as_ref().is_some_and(|st| st.running.is_some()) || s.container_id.is_some()
        })
    });
    if pending_init > 0 || (pending_sidecars > 0 && !initialized) || waiting > 0 {
        return "Pending";
    }
    if running > 0 && unknown == 0 {
        return "Running";
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        if terminal {
            return if stopped == succeeded {
                "Succeeded"
            } else {
                "Failed"
            };
        }
        return match policy {
            "Always" => "Running",
            _ if stopped == succeeded => "Succeeded",
            "Never" => "Failed",
            _ => "Running",
        };
    }
    "Pending"
}

fn condition(type_: &str, status: &str, reason: &str, message: String) -> PodCondition {
    PodCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.to_string()).filter(|r| !r.is_empty()),
        message: Some(message).filter(|m| !m.is_empty()),
        ..Default::default()
    }
}

/// Go's `%s` of a string slice: `[a b]`.
fn go_list(names: &[String]) -> String {
    format!("[{}]", names.join(" "))
}

/// `GenerateContainersReadyCondition`.
fn containers_ready_condition(
    spec: &PodSpec,
    statuses: &[ContainerStatus],
    phase: &str,
) -> PodCondition {
    let (mut unknown, mut unready) = (Vec::new(), Vec::new());
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| is_sidecar(c));
    for container in sidecars.chain(&spec.containers) {
        match status_of(statuses, &container.name) {
            Some(s) if !s.ready => unready.push(container.name.clone()),
            Some(_) => {}
            None => unknown.push(container.name.clone()),
        }
    }
    if (phase == "Succeeded" && unknown.is_empty()) || phase == "Failed" {
        let reason = if phase == "Failed" {
            "PodFailed"
        } else {
            "PodCompleted"
        };
        return condition("ContainersReady", "False", reason, String::new());
    }
    let mut messages = Vec::new();
    if !unknown.is_empty() {
        messages.push(format!(
            "containers with unknown status: {}",
            go_list(&unknown)
        ));
    }
    if !unready.is_empty() {
        messages.push(format!(
            "containers with unready status: {}",
            go_list(&unready)
        ));
    }
    if messages.is_empty() {
        return condition("ContainersReady", "True", "", String::new());
    }
    condition(
        "ContainersReady",
        "False",
        "ContainersNotReady",
        messages.join(", "),
    )
}

/// `GeneratePodReadyCondition`: ContainersReady, then the readiness gates.
fn ready_condition(
    spec: &PodSpec,
    conditions: &[PodCondition],
    statuses: &[ContainerStatus],
    phase: &str,
) -> PodCondition {
    let containers = containers_ready_condition(spec, statuses, phase);
    if containers.status != "True" {
        return PodCondition {
            type_: "Ready".into(),
            ..containers
        };
    }
    let mut messages = Vec::new();
    for gate in spec.readiness_gates.iter().flatten() {
        match conditions.iter().find(|c| c.type_ == gate.condition_type) {
            None => messages.push(format!(
                "corresponding condition of pod readiness gate {:?} does not exist.",
                gate.condition_type
            )),
            Some(c) if c.status != "True" => messages.push(format!(
                "the status of pod readiness gate {:?} is not \"True\", but {}",
                gate.condition_type, c.status
            )),
            Some(_) => {}
        }
    }
    if messages.is_empty() {
        return condition("Ready", "True", "", String::new());
    }
    condition(
        "Ready",
        "False",
        "ReadinessGatesNotReady",
        messages.join(", "),
    )
}

/// `GeneratePodInitializedCondition`.
fn initialized_condition(
    spec: &PodSpec,
    statuses: &[ContainerStatus],
    phase: &str,
) -> PodCondition {
    let (mut unknown, mut incomplete) = (Vec::new(), Vec::new());
    for container in spec.init_containers.iter().flatten() {
        let Some(status) = status_of(statuses, &container.name) else {
            unknown.push(container.name.clone());
            continue;
        };
        let done = if is_sidecar(container) {
            status.started == Some(true)
        } else {
            status.ready
        };
        if !done {
            incomplete.push(container.name.clone());
        }
    }
    if phase == "Succeeded" && unknown.is_empty() {
        return condition("Initialized", "True", "PodCompleted", String::new());
    }
    // A regular container that started means the pod was initialized (sidecars may be restarting).
    let started = spec.containers.iter().any(|c| {
        status_of(statuses, &c.name).is_some_and(|s| {
            s.state
                .as_ref()
                .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
                || last_terminated(s).is_some()
        })
    });
    if started {
        return condition("Initialized", "True", "", String::new());
    }
    let mut messages = Vec::new();
    if !unknown.is_empty() {
        messages.push(format!(
            "containers with unknown status: {}",
            go_list(&unknown)
        ));
    }
    if !incomplete.is_empty() {
        messages.push(format!(
            "containers with incomplete status: {}",
            go_list(&incomplete)
        ));
    }
    if messages.is_empty() {
        return condition("Initialized", "True", "", String::new());
    }
    condition(
        "Initialized",
        "False",
        "ContainersNotInitialized",
        messages.join(", "),
    )
}

/// `updateLastTransitionTime`: a condition keeps the time it last changed status.
fn keep_transition_times(conditions: &mut [PodCondition], old: &[PodCondition]) {
    for c in conditions.iter_mut() {
        if c.last_transition_time.is_some() {
            continue;
        }
        let before = old
            .iter()
            .find(|o| o.type_ == c.type_ && o.status == c.status);
        c.last_transition_time = before
            .and_then(|o| o.last_transition_time.clone())
            .or_else(|| Some(now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(init: &[&str], sidecars: &[&str], app: &[&str], policy: &str) -> PodSpec {
        let container = |name: &&str, restart: Option<&str>| Container {
            name: name.to_string(),
            restart_policy: restart.map(str::to_string),
            ..Default::default()
        };
        PodSpec {
            init_containers: Some(
                init.iter()
                    .map(|n| container(n, None))
                    .chain(sidecars.iter().map(|n| container(n, Some("Always"))))
                    .collect(),
            ),
            containers: app.iter().map(|n| container(n, None)).collect(),
            restart_policy: Some(policy.into()),
            ..Default::default()
        }
    }

    fn status(name: &str, state: &str, code: i32) -> ContainerStatus {
        let state = match state {
            "running" => ApiContainerState {
                running: Some(Default::default()),
                ..Default::default()
            },
            "terminated" => ApiContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: code,
                    ..Default::default()
                }),
                ..Default::default()
            },
            _ => ApiContainerState {
                waiting: Some(Default::default()),
                ..Default::default()
            },
        };
        ContainerStatus {
            name: name.into(),
            ready: state.running.is_some()
                || state.terminated.as_ref().is_some_and(|t| t.exit_code == 0),
            started: Some(state.running.is_some()),
            state: Some(state),
            ..Default::default()
        }
    }

    #[test]
    fn init_containers_keep_the_pod_pending_and_a_failed_one_fails_it_under_never() {
        let s = spec(&["setup"], &[], &["app"], "Never");
        assert_eq!(
            get_phase(&s, &[status("setup", "running", 0)], false),
            "Pending"
        );
        assert_eq!(
            get_phase(&s, &[status("setup", "terminated", 1)], false),
            "Failed"
        );
        let onfailure = spec(&["setup"], &[], &["app"], "OnFailure");
        assert_eq!(
            get_phase(&onfailure, &[status("setup", "terminated", 1)], false),
            "Pending"
        );
        let done = [
            status("setup", "terminated", 0),
            status("app", "running", 0),
        ];
        assert_eq!(get_phase(&s, &done, false), "Running");
    }

    #[test]
    fn sidecars_do_not_count_for_completion() {
        let s = spec(&[], &["proxy"], &["app"], "Never");
        let statuses = [
            status("proxy", "running", 0),
            status("app", "terminated", 0),
        ];
        assert_eq!(get_phase(&s, &statuses, true), "Succeeded");
    }

    #[test]
    fn a_crash_looping_container_makes_the_pod_unready_with_upstreams_message() {
        let s = spec(&[], &[], &["app", "side"], "Always");
        let statuses = [status("app", "waiting", 0), status("side", "running", 0)];
        let ready = ready_condition(&s, &[], &statuses, "Running");
        assert_eq!(
            (
                ready.status.as_str(),
                ready.reason.as_deref(),
                ready.message.as_deref()
            ),
            (
                "False",
                Some("ContainersNotReady"),
                Some("containers with unready status: [app]")
            )
        );
        let init = spec(&["setup"], &[], &["app"], "Always");
        // A regular init container is not ready while it runs.
        let running = ContainerStatus {
            ready: false,
            ..status("setup", "running", 0)
        };
        let initialized = initialized_condition(&init, &[running], "Pending");
        assert_eq!(
            (
                initialized.reason.as_deref(),
                initialized.message.as_deref()
            ),
            (
                Some("ContainersNotInitialized"),
                Some("containers with incomplete status: [setup]")
            )
        );
    }

    #[test]
    fn a_transition_time_changes_only_with_the_status() {
        let mut old = condition("Ready", "True", "", String::new());
        old.last_transition_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        let mut same = [condition("Ready", "True", "", String::new())];
        keep_transition_times(&mut same, std::slice::from_ref(&old));
        assert_eq!(same[0].last_transition_time, old.last_transition_time);
        let mut changed = [condition(
            "Ready",
            "False",
            "ContainersNotReady",
            String::new(),
        )];
        keep_transition_times(&mut changed, &[old.clone()]);
        assert_ne!(changed[0].last_transition_time, old.last_transition_time);
    }
}
