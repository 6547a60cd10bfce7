//! Tests of the phase and the conditions, over hand-made container statuses.

use k8s_openapi::api::core::v1::{
    Container, ContainerState as ApiContainerState, ContainerStateTerminated, ContainerStatus,
    PodSpec,
};

use super::conditions::{condition, initialized_condition, keep_transition_times, ready_condition};
use super::phase::get_phase;

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
