//! `getPhase` (`kubelet_pods.go`): a pod's phase from its container statuses.

use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStatus, PodSpec};

use super::is_sidecar;

pub(super) fn status_of<'a>(
    statuses: &'a [ContainerStatus],
    name: &str,
) -> Option<&'a ContainerStatus> {
    statuses.iter().find(|s| s.name == name)
}

pub(super) fn last_terminated(status: &ContainerStatus) -> Option<&ContainerStateTerminated> {
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
