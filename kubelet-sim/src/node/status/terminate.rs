//! The last word on a pod that will run nothing again (`status_manager.go` TerminatePod, with
//! `ShouldContainerBeRestarted`'s answer for a pod that will not restart): a container waiting for a
//! restart shows the run it ended with; one that never ran, once the pod initialized, is reported
//! terminated with `ContainerStatusUnknown` and 137, as is every init container but the trailing ones that
//! never started; and the phase is terminal.

use k8s_openapi::api::core::v1::{
    ContainerState as ApiContainerState, ContainerStateTerminated, ContainerStatus, PodSpec,
};

use super::is_sidecar;

/// `kubecontainer.ContainerReasonStatusUnknown`.
const STATUS_UNKNOWN: &str = "ContainerStatusUnknown";
/// TerminatePod's message for it.
const NOT_LOCATED: &str = "The container could not be located when the pod was terminated";

/// Applies TerminatePod to a terminal pod's statuses and returns its phase, terminal.
pub(super) fn terminate_pod(
    spec: &PodSpec,
    phase: &'static str,
    statuses: &mut [ContainerStatus],
    init_statuses: &mut [ContainerStatus],
) -> &'static str {
    for status in statuses.iter_mut().chain(init_statuses.iter_mut()) {
        show_last_run(status);
    }
    if has_pod_initialized(spec, statuses, init_statuses) {
        statuses.iter_mut().for_each(mark_unknown);
    }
    let started = initialized_containers(init_statuses);
    init_statuses[..started].iter_mut().for_each(mark_unknown);
    match phase {
        "Succeeded" | "Failed" => phase,
        _ => "Failed",
    }
}

/// A container waiting to be restarted that will not be shows its last run as its state.
fn show_last_run(status: &mut ContainerStatus) {
    let waiting = status.state.as_ref().is_some_and(|s| s.waiting.is_some());
    if waiting
        && status
            .last_state
            .as_ref()
            .is_some_and(|s| s.terminated.is_some())
    {
        status.state = status.last_state.take();
    }
}

fn mark_unknown(status: &mut ContainerStatus) {
    if status
        .state
        .as_ref()
        .is_some_and(|s| s.terminated.is_some())
    {
        return;
    }
    status.ready = false;
    status.started = Some(false);
    status.state = Some(ApiContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: 137,
            reason: Some(STATUS_UNKNOWN.into()),
            message: Some(NOT_LOCATED.into()),
            ..Default::default()
        }),
        ..Default::default()
    });
}

fn is_waiting(status: &ContainerStatus) -> bool {
    status.state.as_ref().is_none_or(|s| s.waiting.is_some())
}

/// `hasPodInitialized`: no init containers; a regular container that left waiting; or the last init
/// container completed (or, a sidecar, started).
fn has_pod_initialized(
    spec: &PodSpec,
    statuses: &[ContainerStatus],
    init_statuses: &[ContainerStatus],
) -> bool {
    let init = spec.init_containers.as_deref().unwrap_or_default();
    if init.is_empty() {
        return true;
    }
    if statuses.iter().any(|s| {
        !is_waiting(s)
            || s.last_state
                .as_ref()
                .is_some_and(|l| l.terminated.is_some())
    }) {
        return true;
    }
    let (Some(last), Some(status)) = (init.last(), init_statuses.last()) else {
        return false;
    };
    if is_sidecar(last) {
        let running = status.state.as_ref().is_some_and(|s| s.running.is_some());
        return running && status.started == Some(true);
    }
    let completed = |s: Option<&ApiContainerState>| {
        s.and_then(|s| s.terminated.as_ref())
            .is_some_and(|t| t.exit_code == 0)
    };
    completed(status.last_state.as_ref()) || completed(status.state.as_ref())
}

/// `initializedContainers`: how many init containers, from the first, are not in the trailing run of
/// waiting ones; at least one.
fn initialized_containers(init_statuses: &[ContainerStatus]) -> usize {
    let trailing = init_statuses
        .iter()
        .rev()
        .take_while(|s| is_waiting(s))
        .count();
    (init_statuses.len() - trailing)
        .max(1)
        .min(init_statuses.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, ContainerStateWaiting};

    fn waiting(name: &str) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(ApiContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("PodInitializing".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn reason(status: &ContainerStatus) -> Option<String> {
        let state = status.state.as_ref()?;
        match (&state.waiting, &state.terminated) {
            (Some(w), _) => w.reason.clone(),
            (_, Some(t)) => t.reason.clone(),
            _ => None,
        }
    }

    #[test]
    fn a_never_started_container_of_an_initialized_pod_is_unknown() {
        let spec = PodSpec {
            containers: vec![Container::default()],
            ..Default::default()
        };
        let mut statuses = vec![waiting("app")];
        let phase = terminate_pod(&spec, "Pending", &mut statuses, &mut []);
        assert_eq!(phase, "Failed");
        assert_eq!(reason(&statuses[0]).as_deref(), Some(STATUS_UNKNOWN));
        let exit = statuses[0]
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref());
        assert_eq!(exit.map(|t| t.exit_code), Some(137));
    }

    #[test]
    fn only_init_containers_that_started_are_marked_and_regular_ones_wait() {
        let spec = PodSpec {
            init_containers: Some(vec![Container::default(), Container::default()]),
            containers: vec![Container::default()],
            ..Default::default()
        };
        let (mut statuses, mut init) = (vec![waiting("app")], vec![waiting("a"), waiting("b")]);
        terminate_pod(&spec, "Pending", &mut statuses, &mut init);
        assert_eq!(
            reason(&init[0]).as_deref(),
            Some(STATUS_UNKNOWN),
            "the first always"
        );
        assert_eq!(reason(&init[1]).as_deref(), Some("PodInitializing"));
        assert_eq!(
            reason(&statuses[0]).as_deref(),
            Some("PodInitializing"),
            "not initialized"
        );
    }
}
