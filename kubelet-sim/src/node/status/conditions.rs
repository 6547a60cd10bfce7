//! The pod conditions the kubelet generates (`status/generate.go`), and their transition times
//! (`status_manager.go` updateLastTransitionTime).

use k8s_openapi::api::core::v1::{ContainerStatus, PodCondition, PodSpec};

use super::is_sidecar;
use super::phase::{last_terminated, status_of};
use crate::api::now;

pub(super) fn condition(type_: &str, status: &str, reason: &str, message: String) -> PodCondition {
    PodCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.to_string()).filter(|r| !r.is_empty()),
        message: Some(message).filter(|m| !m.is_empty()),
        ..Default::default()
    }
}

/// `containers with unknown status: [a], containers with unready status: [b c]`: each group that has
/// names, as generate.go words them.
fn status_message(groups: &[(&str, &Vec<String>)]) -> String {
    let parts: Vec<String> = groups
        .iter()
        .filter(|(_, names)| !names.is_empty())
        .map(|(what, names)| format!("containers with {what} status: {}", go_list(names)))
        .collect();
    parts.join(", ")
}

/// Go's `%s` of a string slice: `[a b]`.
fn go_list(names: &[String]) -> String {
    format!("[{}]", names.join(" "))
}

/// `GenerateContainersReadyCondition`.
pub(super) fn containers_ready_condition(
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
    let message = status_message(&[("unknown", &unknown), ("unready", &unready)]);
    if message.is_empty() {
        return condition("ContainersReady", "True", "", String::new());
    }
    condition("ContainersReady", "False", "ContainersNotReady", message)
}

/// `GeneratePodReadyCondition`: ContainersReady, then the readiness gates.
pub(super) fn ready_condition(
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
pub(super) fn initialized_condition(
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
    let message = status_message(&[("unknown", &unknown), ("incomplete", &incomplete)]);
    if message.is_empty() {
        return condition("Initialized", "True", "", String::new());
    }
    condition("Initialized", "False", "ContainersNotInitialized", message)
}

/// `updateLastTransitionTime`: a condition keeps the time it last changed status.
pub(super) fn keep_transition_times(conditions: &mut [PodCondition], old: &[PodCondition]) {
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
